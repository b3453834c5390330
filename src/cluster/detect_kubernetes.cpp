// A pod of a Kubernetes job that names its master the way PyTorch's env:// expects: Kubeflow's
// PyTorchJob (MASTER_ADDR=<job>-master-0, MASTER_PORT, RANK = the pod's index, master 0 and
// workers 1..n) and Volcano's pytorch plugin (MASTER_ADDR, MASTER_PORT, WORLD_SIZE = pods,
// RANK = pod index). Marker: KUBERNETES_SERVICE_HOST (every pod has it) with MASTER_ADDR and RANK.
// A pod is a node: RANK is the node rank, WORLD_SIZE the node count. Newer PyTorchJobs also set
// PET_NNODES and PET_NODE_RANK (their WORLD_SIZE counts processes): ddprun reads those as
// flags, which win over what is detected here. Kubeflow Trainer (TrainJob) and JobSet set
// only PET_ variables and need no detection.
#include <fmt/format.h>

#include "ddp/util/error.hpp"
#include "detect_internal.hpp"

namespace ddp::cluster::detail {

std::optional<Detection> detect_kubernetes(const EnvMap& env) {
  if (!lookup(env, "KUBERNETES_SERVICE_HOST")) return std::nullopt;
  auto master = lookup(env, "MASTER_ADDR");
  auto rank = lookup_int(env, "RANK");
  if (!master || !rank) return std::nullopt;

  Detection d;
  ClusterInfo& info = d.info;
  info.source = "kubernetes";
  info.master_addr = *master;
  info.origin.master_addr = Origin::kDetected;
  info.node_rank = *rank;
  info.origin.node_rank = Origin::kDetected;
  if (auto port = lookup_int(env, "MASTER_PORT")) {
    if (*port < 1 || *port > 65535) {
      throw UsageError(fmt::format("MASTER_PORT={} is not a TCP port (1-65535)", *port));
    }
    info.master_port = *port;
  }
  if (auto size = lookup_int(env, "WORLD_SIZE")) {
    info.nnodes = *size;
    info.origin.nnodes = Origin::kDetected;
  }
  return d;
}

}  // namespace ddp::cluster::detail
