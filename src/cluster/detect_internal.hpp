#pragma once
// One detector per scheduler. Each returns nullopt when its marker variable is absent
// (SLURM_JOB_ID, PBS_JOBID/PBS_NODEFILE, OMPI_COMM_WORLD_SIZE, KUBERNETES_SERVICE_HOST with
// MASTER_ADDR and RANK) and otherwise a ClusterInfo
// with source, nnodes, node_rank, master_addr, run_id and hints filled (origins kDetected),
// but no explanation: detect.cpp applies overrides, validates and explains.
//
// A detector that cannot tell this node's rank leaves node_rank at -1 and puts the reason in
// `missing`; detect.cpp turns that into a UsageError unless --node-rank was given.

#include <optional>
#include <string>

#include "ddp/cluster/detect.hpp"

namespace ddp::cluster::detail {

struct Detection {
  ClusterInfo info;
  std::string missing;  // why node_rank is -1
};

std::optional<Detection> detect_slurm(const EnvMap& env, const std::string& hostname);
std::optional<Detection> detect_pbs(const EnvMap& env, const std::string& hostname);
std::optional<Detection> detect_openmpi(const EnvMap& env);
std::optional<Detection> detect_kubernetes(const EnvMap& env);

// Index of `hostname` in hosts, comparing full names and short names (before the first
// '.'), since schedulers list either form. -1 when absent.
int find_host(const std::vector<std::string>& hosts, const std::string& hostname);

// Parses SLURM's tasks-per-node format "2(x3),1" into one count per node.
std::vector<int> parse_slurm_tasks_per_node(const std::string& name, const std::string& value);

}  // namespace ddp::cluster::detail
