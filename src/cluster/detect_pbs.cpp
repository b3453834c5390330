// PBS (PBS Pro, OpenPBS, Torque): PBS_NODEFILE lists one line per slot; its unique hosts in
// order are the nodes, and this node is found by host name.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>

#include "ddp/cluster/hostlist.hpp"
#include "ddp/util/error.hpp"
#include "detect_internal.hpp"

namespace ddp::cluster::detail {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::optional<Detection> detect_pbs(const EnvMap& env, const std::string& hostname) {
  auto job = lookup(env, "PBS_JOBID");
  auto nodefile = lookup(env, "PBS_NODEFILE");
  if (!job && !nodefile) return std::nullopt;
  if (!nodefile) {
    throw UsageError(fmt::format(
        "PBS_JOBID={} is set but PBS_NODEFILE is not: run inside the job (qsub, qsub -I) or "
        "unset PBS_JOBID",
        *job));
  }

  std::ifstream in(*nodefile);
  if (!in) {
    throw UsageError(fmt::format(
        "cannot read PBS_NODEFILE={}: the file is missing or unreadable on this node; run "
        "inside the PBS job that created it",
        *nodefile));
  }
  // Slots per host, hosts in order of first appearance.
  std::vector<std::string> hosts;
  std::vector<int> slots;
  std::string line;
  while (std::getline(in, line)) {
    std::string host = trim(line);
    if (host.empty() || host[0] == '#') continue;
    auto it = std::find(hosts.begin(), hosts.end(), host);
    if (it == hosts.end()) {
      hosts.push_back(host);
      slots.push_back(1);
    } else {
      ++slots[it - hosts.begin()];
    }
  }
  if (hosts.empty()) {
    throw UsageError(
        fmt::format("PBS_NODEFILE={} lists no hosts: check the job's select/nodes "
                    "request",
                    *nodefile));
  }

  Detection d;
  ClusterInfo& info = d.info;
  info.source = "pbs";
  info.hosts = hosts;
  info.nnodes = static_cast<int>(hosts.size());
  info.origin.nnodes = Origin::kDetected;
  info.master_addr = hosts.front();
  info.origin.master_addr = Origin::kDetected;
  if (job) {
    info.run_id = *job;
    info.origin.run_id = Origin::kDetected;
  }

  info.node_rank = find_host(hosts, hostname);
  if (info.node_rank < 0) {
    // Torque's pbsdsh sets PBS_NODENUM per node; use it when the names do not match.
    if (auto nodenum = lookup_int(env, "PBS_NODENUM"); nodenum && *nodenum < info.nnodes) {
      info.node_rank = *nodenum;
    } else {
      d.missing = fmt::format(
          "this host ({}) is not in PBS_NODEFILE={} (hosts: {}): run ddprun on the job's "
          "nodes (e.g. with mpirun or pbsdsh), or pass --node-rank",
          hostname, *nodefile, compress_hostlist(hosts));
    }
  }
  if (info.node_rank >= 0) {
    info.origin.node_rank = Origin::kDetected;
    info.nproc_per_node = slots[info.node_rank];
    info.nproc_reason = fmt::format("PBS_NODEFILE lists this host {} time{}", slots[info.node_rank],
                                    slots[info.node_rank] == 1 ? "" : "s");
    info.origin.nproc_per_node = Origin::kDetected;
  }
  return d;
}

}  // namespace ddp::cluster::detail
