// Dispatch to the scheduler detectors, apply explicit values, validate, explain.
#include "ddp/cluster/detect.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/cluster/hostlist.hpp"
#include "ddp/util/error.hpp"
#include "detect_internal.hpp"

namespace ddp::cluster {

const char* to_string(Origin origin) {
  switch (origin) {
    case Origin::kDefault:
      return "default";
    case Origin::kDetected:
      return "detected";
    case Origin::kExplicit:
      return "explicit";
  }
  return "?";
}

namespace detail {

int find_host(const std::vector<std::string>& hosts, const std::string& hostname) {
  auto short_name = [](const std::string& h) { return h.substr(0, h.find('.')); };
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i] == hostname) return static_cast<int>(i);
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (short_name(hosts[i]) == short_name(hostname)) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace detail

namespace {

const char* display_name(const std::string& source) {
  if (source == "slurm") return "SLURM";
  if (source == "pbs") return "PBS";
  if (source == "openmpi") return "OpenMPI";
  if (source == "kubernetes") return "Kubernetes";
  return "none";
}

// Applies one explicit value, noting what it replaced for the explanation.
template <typename T>
void apply(const std::optional<T>& value, T& field, Origin& origin, const char* flag,
           std::vector<std::string>& notes) {
  if (!value) return;
  if (origin == Origin::kDetected && field != *value) {
    notes.push_back(fmt::format("{} {} (detected {})", flag, *value, field));
  } else {
    notes.push_back(fmt::format("{} {}", flag, *value));
  }
  field = *value;
  origin = Origin::kExplicit;
}

std::string explain(const ClusterInfo& info, const std::vector<std::string>& notes) {
  std::string line;
  if (!info.detected()) {
    line =
        "no cluster detected (none of OMPI_COMM_WORLD_SIZE, SLURM_JOB_ID, PBS_JOBID, "
        "KUBERNETES_SERVICE_HOST with MASTER_ADDR and RANK is set)";
  } else {
    line = fmt::format("using {}: ", display_name(info.source));
    if (!info.run_id.empty()) line += fmt::format("job {}, ", info.run_id);
    line += fmt::format("{} node{}", info.nnodes, info.nnodes == 1 ? "" : "s");
    if (!info.hosts.empty()) line += " " + compress_hostlist(info.hosts);
    line += fmt::format(", this is node {}", info.node_rank);
    if (static_cast<size_t>(info.node_rank) < info.hosts.size() &&
        info.hosts[info.node_rank] != info.master_addr) {
      line += fmt::format(" ({})", info.hosts[info.node_rank]);
    }
    if (info.master_addr.empty()) {
      line += ", master unknown (pass --master-addr or set MASTER_ADDR)";
    } else {
      line += ", master " + info.master_addr;
      if (info.master_port) line += fmt::format(":{}", *info.master_port);
    }
    if (info.nproc_per_node) {
      line += fmt::format(", {} process{} per node ({})", *info.nproc_per_node,
                          *info.nproc_per_node == 1 ? "" : "es", info.nproc_reason);
    }
  }
  if (!notes.empty()) line += fmt::format("; explicit: {}", fmt::join(notes, ", "));
  return line;
}

std::optional<detail::Detection> run_detector(const std::string& scheduler, const EnvMap& env,
                                              const std::string& hostname) {
  if (scheduler == "slurm") return detail::detect_slurm(env, hostname);
  if (scheduler == "pbs") return detail::detect_pbs(env, hostname);
  if (scheduler == "openmpi") return detail::detect_openmpi(env);
  if (scheduler == "kubernetes") return detail::detect_kubernetes(env);
  return std::nullopt;
}

const char* marker_variable(const std::string& scheduler) {
  if (scheduler == "slurm") return "SLURM_JOB_ID";
  if (scheduler == "pbs") return "PBS_JOBID or PBS_NODEFILE";
  if (scheduler == "kubernetes") return "KUBERNETES_SERVICE_HOST with MASTER_ADDR and RANK";
  return "OMPI_COMM_WORLD_SIZE";
}

}  // namespace

ClusterInfo detect_cluster(const EnvMap& env, const DetectOptions& options) {
  const std::string& scheduler = options.scheduler;
  if (scheduler != "auto" && scheduler != "slurm" && scheduler != "pbs" && scheduler != "openmpi" &&
      scheduler != "kubernetes" && scheduler != "none") {
    throw UsageError(fmt::format(
        "unknown scheduler '{}': use one of auto, slurm, pbs, openmpi, kubernetes, none",
        scheduler));
  }
  std::string hostname = options.hostname.empty() ? local_hostname() : options.hostname;

  std::optional<detail::Detection> found;
  if (scheduler == "auto") {
    for (const char* s : {"openmpi", "slurm", "pbs", "kubernetes"}) {
      found = run_detector(s, env, hostname);
      if (found) break;
    }
  } else if (scheduler != "none") {
    found = run_detector(scheduler, env, hostname);
    if (!found) {
      throw UsageError(
          fmt::format("scheduler {} was asked for but {} is not set: run inside a "
                      "{} job or use auto detection",
                      scheduler, marker_variable(scheduler), display_name(scheduler)));
    }
  }

  ClusterInfo info = found ? found->info : ClusterInfo{};
  const ClusterOverrides& o = options.overrides;
  std::vector<std::string> notes;
  apply(o.nnodes, info.nnodes, info.origin.nnodes, "--nnodes", notes);
  apply(o.node_rank, info.node_rank, info.origin.node_rank, "--node-rank", notes);
  apply(o.master_addr, info.master_addr, info.origin.master_addr, "--master-addr", notes);
  apply(o.run_id, info.run_id, info.origin.run_id, "--rdzv-id", notes);
  if (o.nproc_per_node) {
    std::optional<int> before = info.nproc_per_node;
    int value = before.value_or(0);
    apply(o.nproc_per_node, value, info.origin.nproc_per_node, "--nproc-per-node", notes);
    info.nproc_per_node = value;
    info.nproc_reason = "--nproc-per-node";
  }

  if (info.node_rank < 0) throw UsageError(found->missing);
  if (info.nnodes < 1) {
    throw UsageError(fmt::format("--nnodes {} is not positive: give at least 1", info.nnodes));
  }
  if (info.node_rank >= info.nnodes) {
    throw UsageError(fmt::format(
        "node rank {} ({}) is not below the node count {} ({}): node ranks run from 0 to {}",
        info.node_rank, to_string(info.origin.node_rank), info.nnodes,
        to_string(info.origin.nnodes), info.nnodes - 1));
  }
  if (info.nproc_per_node && *info.nproc_per_node < 1) {
    throw UsageError(
        fmt::format("--nproc-per-node {} is not positive: give at least 1", *info.nproc_per_node));
  }
  info.explanation = explain(info, notes);
  return info;
}

ClusterInfo detect_cluster_from_environment(const DetectOptions& options) {
  return detect_cluster(current_environment(), options);
}

}  // namespace ddp::cluster
