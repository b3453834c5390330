#include "ddp/launcher/worker_env.hpp"

#include <unistd.h>  // environ
#include <algorithm>
#include <map>
#include <utility>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

std::vector<std::string> build_worker_env(const std::vector<std::string>& base,
                                          const WorkerEnvInputs& in) {
  if (in.world == nullptr) throw Error("build_worker_env: no world assignment given");
  const WorldAssignment& w = *in.world;

  std::vector<std::pair<std::string, std::string>> set = {
      {"LOCAL_RANK", std::to_string(in.worker.local_rank)},
      {"RANK", std::to_string(in.worker.global_rank)},
      {"GROUP_RANK", std::to_string(w.group_rank)},
      {"ROLE_RANK", std::to_string(in.worker.role_rank)},
      {"ROLE_NAME", in.role},
      {"LOCAL_WORLD_SIZE", std::to_string(w.local_world_size)},
      {"WORLD_SIZE", std::to_string(w.world_size)},
      {"GROUP_WORLD_SIZE", std::to_string(w.group_world_size)},
      {"ROLE_WORLD_SIZE", std::to_string(w.role_world_size)},
      {"MASTER_ADDR", w.master_addr},
      {"MASTER_PORT", std::to_string(w.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(in.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(in.max_restarts)},
      {"TORCHELASTIC_RUN_ID", in.run_id},
      {"TORCHELASTIC_ERROR_FILE", in.error_file},
  };
  if (in.set_omp_threads) set.emplace_back("OMP_NUM_THREADS", "1");

  std::map<std::string, bool> overridden;
  for (const auto& kv : set) overridden[kv.first] = true;
  // No agent store exists: PyTorch must host the TCPStore on rank 0 itself.
  overridden["TORCHELASTIC_USE_AGENT_STORE"] = true;

  std::vector<std::string> env;
  env.reserve(base.size() + set.size());
  for (const auto& entry : base) {
    auto eq = entry.find('=');
    std::string key = entry.substr(0, eq);
    if (overridden.count(key) == 0) env.push_back(entry);
  }
  for (const auto& kv : set) env.push_back(kv.first + "=" + kv.second);
  return env;
}

void set_env_entry(std::vector<std::string>& env, const std::string& key,
                   const std::string& value) {
  const std::string prefix = key + "=";
  env.erase(std::remove_if(
                env.begin(), env.end(),
                [&](const std::string& e) { return e.compare(0, prefix.size(), prefix) == 0; }),
            env.end());
  env.push_back(prefix + value);
}

}  // namespace ddp::launcher
