// SLURM: the job's (or, inside srun, the step's) node list, this node's index, the job id.
#include <fmt/format.h>

#include <regex>

#include "ddp/cluster/hostlist.hpp"
#include "ddp/util/error.hpp"
#include "detect_internal.hpp"

namespace ddp::cluster::detail {

namespace {

// The first of `names` that is set, as (name, value).
std::optional<std::pair<std::string, std::string>> first_of(
    const EnvMap& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto value = lookup(env, name)) return std::make_pair(std::string(name), *value);
  }
  return std::nullopt;
}

// "4", "a100:4", "gpu:a100:4" -> 4 (SLURM_GPUS_PER_NODE is [type:]count).
std::optional<int> gpu_count(const std::string& value) {
  std::string count =
      value.substr(value.rfind(':') == std::string::npos ? 0 : value.rfind(':') + 1);
  if (count.empty() || count.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoi(count);
}

}  // namespace

std::vector<int> parse_slurm_tasks_per_node(const std::string& name, const std::string& value) {
  static const std::regex item(R"((\d+)(?:\(x(\d+)\))?)");
  std::vector<int> counts;
  size_t begin = 0;
  while (begin <= value.size()) {
    size_t end = value.find(',', begin);
    if (end == std::string::npos) end = value.size();
    std::smatch m;
    std::string text = value.substr(begin, end - begin);
    if (!std::regex_match(text, m, item)) {
      throw UsageError(fmt::format(
          "{}={} is not SLURM's tasks-per-node format (e.g. \"2(x3),1\"): unset it or fix it", name,
          value));
    }
    int repeat = m[2].matched ? std::stoi(m[2]) : 1;
    counts.insert(counts.end(), repeat, std::stoi(m[1]));
    begin = end + 1;
  }
  return counts;
}

std::optional<Detection> detect_slurm(const EnvMap& env, const std::string& hostname) {
  auto job = first_of(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job) return std::nullopt;

  Detection d;
  ClusterInfo& info = d.info;
  info.source = "slurm";
  info.run_id = job->second;
  info.origin.run_id = Origin::kDetected;

  // Inside srun the step's nodes are what SLURM_NODEID counts; in the batch script the job's.
  auto nodelist = first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!nodelist) {
    throw UsageError(
        fmt::format("SLURM job {} is set ({}) but SLURM_JOB_NODELIST is not: run inside the job's "
                    "allocation (sbatch, salloc, srun) or unset {}",
                    job->second, job->first, job->first));
  }
  info.hosts = expand_hostlist(nodelist->second);
  info.nnodes = static_cast<int>(info.hosts.size());
  info.origin.nnodes = Origin::kDetected;
  info.master_addr = info.hosts.front();
  info.origin.master_addr = Origin::kDetected;

  bool in_step = lookup(env, "SLURM_STEP_NODELIST").has_value();
  auto count_var = in_step ? first_of(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"})
                           : first_of(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"});
  if (count_var) {
    int count = lookup_int(env, count_var->first).value();
    if (count != info.nnodes) {
      info.warnings.push_back(fmt::format("{}={} but {}={} names {} nodes; using the node list",
                                          count_var->first, count, nodelist->first,
                                          nodelist->second, info.nnodes));
    }
  }

  std::string node_name = lookup(env, "SLURMD_NODENAME").value_or(hostname);
  if (auto node_id = lookup_int(env, "SLURM_NODEID")) {
    if (*node_id >= info.nnodes) {
      throw UsageError(fmt::format(
          "SLURM_NODEID={} is not below the {} nodes of {}={}: the SLURM variables come from "
          "different jobs or steps; unset the stale ones",
          *node_id, info.nnodes, nodelist->first, nodelist->second));
    }
    info.node_rank = *node_id;
    if (find_host(info.hosts, node_name) >= 0 &&
        find_host({info.hosts[info.node_rank]}, node_name) < 0) {
      info.warnings.push_back(fmt::format("SLURM_NODEID={} names {} but this node is {}", *node_id,
                                          info.hosts[info.node_rank], node_name));
    }
  } else {
    info.node_rank = find_host(info.hosts, node_name);
    if (info.node_rank < 0) {
      d.missing = fmt::format(
          "SLURM_NODEID is unset and this host ({}) is not in {}={}: start ddprun with srun "
          "inside the allocation, or pass --node-rank",
          node_name, nodelist->first, nodelist->second);
    }
  }
  if (info.node_rank >= 0) info.origin.node_rank = Origin::kDetected;

  // Tasks srun started on this node: ddprun wants exactly one, since it starts the workers.
  int tasks_here = 1;
  if (in_step && info.node_rank >= 0) {
    if (auto tpn = lookup(env, "SLURM_STEP_TASKS_PER_NODE")) {
      auto counts = parse_slurm_tasks_per_node("SLURM_STEP_TASKS_PER_NODE", *tpn);
      if (static_cast<size_t>(info.node_rank) < counts.size()) tasks_here = counts[info.node_rank];
    }
    if (tasks_here > 1) {
      info.warnings.push_back(fmt::format(
          "srun started {} tasks on this node (SLURM_STEP_TASKS_PER_NODE): ddprun starts the "
          "workers itself and should run once per node; use srun --ntasks-per-node=1",
          tasks_here));
    }
  }

  if (auto gpus = lookup(env, "SLURM_GPUS_ON_NODE"); gpus && gpu_count(*gpus)) {
    info.nproc_per_node = gpu_count(*gpus);
    info.nproc_reason = "SLURM_GPUS_ON_NODE=" + *gpus;
  } else if (auto per_node = lookup(env, "SLURM_GPUS_PER_NODE"); per_node && gpu_count(*per_node)) {
    info.nproc_per_node = gpu_count(*per_node);
    info.nproc_reason = "SLURM_GPUS_PER_NODE=" + *per_node;
  } else if (auto ntasks = lookup_int(env, "SLURM_NTASKS_PER_NODE"); ntasks && tasks_here <= 1) {
    // Tasks requested per node at the job level are the slots the user meant for workers.
    info.nproc_per_node = *ntasks;
    info.nproc_reason = fmt::format("SLURM_NTASKS_PER_NODE={}", *ntasks);
  }
  if (info.nproc_per_node) info.origin.nproc_per_node = Origin::kDetected;
  return d;
}

}  // namespace ddp::cluster::detail
