#pragma once
// The environment a worker starts with (DESIGN.md's contract, same names as torchrun): the
// launcher's own environment plus RANK, LOCAL_RANK, WORLD_SIZE, ... Variables the launcher
// sets override inherited ones. TORCHELASTIC_USE_AGENT_STORE is removed, so PyTorch's
// env:// init makes rank 0 host the TCPStore itself (ddprun runs no agent store).

#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/world.hpp"

namespace ddp::launcher {

struct WorkerEnvInputs {
  const WorldAssignment* world = nullptr;
  WorkerIdentity worker;
  std::string role;
  std::string run_id;
  int restart_count = 0;
  int max_restarts = 0;
  std::string error_file;        // TORCHELASTIC_ERROR_FILE
  bool set_omp_threads = false;  // OMP_NUM_THREADS=1 (caller decides: nproc > 1 and unset)
  // --virtual-local-rank: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES naming only this worker's GPU
  // (entry LOCAL_RANK of base's CUDA_VISIBLE_DEVICES, or LOCAL_RANK when base has none).
  bool virtual_local_rank = false;
};

// --virtual-local-rank's CUDA_VISIBLE_DEVICES for `local_rank`, from the launcher's own value
// (`visible`, nullopt when unset); UsageError when the list has no entry `local_rank`.
std::string virtual_visible_device(const std::optional<std::string>& visible, int local_rank);

// `base` is "KEY=VALUE" entries (e.g. from environ). Returns "KEY=VALUE" entries.
std::vector<std::string> build_worker_env(const std::vector<std::string>& base,
                                          const WorkerEnvInputs& inputs);

// Sets KEY=VALUE in `env` ("KEY=VALUE" entries), replacing every existing entry for KEY.
void set_env_entry(std::vector<std::string>& env, const std::string& key, const std::string& value);

// The current process environment as "KEY=VALUE" entries.
std::vector<std::string> current_environment();

}  // namespace ddp::launcher
