// OpenMPI's mpirun: every process it starts has OMPI_COMM_WORLD_{SIZE,RANK,LOCAL_RANK,
// LOCAL_SIZE}. The intended use is one ddprun per node (mpirun --map-by ppr:1:node), so a
// rank is a node. mpirun exports no host list, hence no master address unless MASTER_ADDR is
// set (mpirun -x MASTER_ADDR=...).
#include <fmt/format.h>

#include "ddp/util/error.hpp"
#include "detect_internal.hpp"

namespace ddp::cluster::detail {

std::optional<Detection> detect_openmpi(const EnvMap& env) {
  auto size = lookup_int(env, "OMPI_COMM_WORLD_SIZE");
  if (!size) return std::nullopt;
  auto rank = lookup_int(env, "OMPI_COMM_WORLD_RANK");
  if (!rank || *size < 1 || *rank >= *size) {
    throw UsageError(fmt::format(
        "OMPI_COMM_WORLD_SIZE={} but OMPI_COMM_WORLD_RANK={}: the OpenMPI variables are "
        "inconsistent; start ddprun with mpirun, or unset them",
        *size, rank ? std::to_string(*rank) : "unset"));
  }
  int local_size = lookup_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
  if (local_size < 1) local_size = 1;

  Detection d;
  ClusterInfo& info = d.info;
  info.source = "openmpi";
  if (local_size == 1) {
    info.nnodes = *size;
    info.node_rank = *rank;
  } else {
    // Several processes per node: mpirun's default by-slot mapping fills node 0 first, so a
    // node is a block of local_size consecutive ranks.
    info.nnodes = (*size + local_size - 1) / local_size;
    info.node_rank = *rank / local_size;
    info.warnings.push_back(fmt::format(
        "mpirun started {} processes on this node (OMPI_COMM_WORLD_LOCAL_SIZE): ddprun starts "
        "the workers itself and should run once per node; use mpirun --map-by ppr:1:node",
        local_size));
  }
  info.origin.nnodes = Origin::kDetected;
  info.origin.node_rank = Origin::kDetected;

  if (auto master = lookup(env, "MASTER_ADDR")) {
    info.master_addr = *master;
    info.origin.master_addr = Origin::kDetected;
  }
  if (auto job = lookup(env, "OMPI_MCA_ess_base_jobid")) {
    info.run_id = *job;
  } else if (auto ns = lookup(env, "PMIX_NAMESPACE")) {
    info.run_id = *ns;
  }
  if (!info.run_id.empty()) info.origin.run_id = Origin::kDetected;
  return d;
}

}  // namespace ddp::cluster::detail
