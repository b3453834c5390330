#pragma once
// Cluster detection: inside a SLURM, PBS or mpirun allocation, ddprun needs no rendezvous
// flags. detect_cluster() reads the variables those systems set and returns how many nodes
// take part, which one this is, the master host, a run id and a hint for processes per node.
//
// Order: explicit values (command-line flags) win field by field; then OpenMPI (set only in
// processes mpirun started, so it is the innermost launcher even inside a SLURM or PBS job),
// then SLURM, then PBS, then a Kubernetes job's pod (PyTorchJob, Volcano: detect_kubernetes.cpp).
// Inconsistent variables (a node rank past the node count, this host missing from PBS_NODEFILE, a
// bad host list) are UsageErrors naming the variables and the fix, never a silent guess.

#include <optional>
#include <string>
#include <vector>

#include "ddp/cluster/environment.hpp"

namespace ddp::cluster {

// Where a field's value came from.
enum class Origin { kDefault, kDetected, kExplicit };
const char* to_string(Origin origin);

// Values the user gave explicitly (ddprun's --nnodes, --node-rank, --master-addr,
// --rdzv-id, --nproc-per-node). Each one set wins over what detection finds.
struct ClusterOverrides {
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;
  std::optional<std::string> run_id;
  std::optional<int> nproc_per_node;
};

struct DetectOptions {
  // "auto" (try OpenMPI, SLURM, PBS, Kubernetes in turn), "slurm", "pbs", "openmpi",
  // "kubernetes" (that one or a
  // UsageError saying which variable is missing) or "none" (detect nothing).
  std::string scheduler = "auto";
  ClusterOverrides overrides;
  // This machine's name as the scheduler lists it; empty means gethostname(). Used to find
  // this node in PBS_NODEFILE and, lacking SLURM_NODEID, in the SLURM node list.
  std::string hostname;
};

struct ClusterInfo {
  // "slurm", "pbs", "openmpi", "kubernetes", or "none" when nothing was detected.
  std::string source = "none";
  int nnodes = 1;
  int node_rank = 0;
  // Host of node 0 (the first host of the allocation); empty when unknown (mpirun does not
  // export it): the launcher then needs --master-addr.
  std::string master_addr;
  // Its port, when the environment says (Kubernetes jobs' MASTER_PORT).
  std::optional<int> master_port;
  std::string run_id;
  // Processes to start on this node, when the scheduler says (GPUs or task slots per node).
  std::optional<int> nproc_per_node;
  // Which variable the hint came from ("SLURM_GPUS_ON_NODE=4").
  std::string nproc_reason;
  // The nodes in node-rank order, when the scheduler lists them (SLURM, PBS).
  std::vector<std::string> hosts;

  struct Origins {
    Origin nnodes = Origin::kDefault;
    Origin node_rank = Origin::kDefault;
    Origin master_addr = Origin::kDefault;
    Origin run_id = Origin::kDefault;
    Origin nproc_per_node = Origin::kDefault;
  } origin;

  // Things that work but are probably not what the user meant (several ddprun per node...).
  std::vector<std::string> warnings;
  // One human-readable line: "using SLURM: job 1234, 4 nodes gpu[001-004], this is node 2,
  // master gpu001".
  std::string explanation;

  bool detected() const { return source != "none"; }
};

// Detects from `env` (see the order above).
ClusterInfo detect_cluster(const EnvMap& env, const DetectOptions& options = {});

// Detects from this process's environment.
ClusterInfo detect_cluster_from_environment(const DetectOptions& options = {});

}  // namespace ddp::cluster
