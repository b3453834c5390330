#pragma once
// Where this process sits in the job: rank, world size, local rank, as announced by whatever
// launched it. Sources, in order of precedence:
//   1. the worker environment contract (ddprun / torchrun): RANK, WORLD_SIZE, LOCAL_RANK,
//      LOCAL_WORLD_SIZE
//   2. SLURM (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
//   3. OpenMPI (mpirun): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//      OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
// A source counts only when both its rank and world-size variables are set; a malformed or
// inconsistent value is a UsageError naming the variable.

#include <functional>
#include <optional>
#include <string>

namespace ddp {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  std::string source;  // "env", "slurm", "openmpi", or "default" when nothing was found
};

// Looks variables up with `getenv` (defaults to the process environment; tests pass a map).
using EnvLookup = std::function<std::optional<std::string>(const char*)>;
WorldInfo detect_world_info(const EnvLookup& getenv = {});

}  // namespace ddp
