#include "ddp/launcher/worker_env.hpp"

#include <fmt/format.h>
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
  if (in.virtual_local_rank) {
    set[0].second = "0";  // LOCAL_RANK
    std::optional<std::string> visible;
    for (const auto& entry : base) {
      if (entry.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0) visible = entry.substr(21);
    }
    set.emplace_back("CUDA_VISIBLE_DEVICES", virtual_visible_device(visible, in.worker.local_rank));
  }

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

std::string virtual_visible_device(const std::optional<std::string>& visible, int local_rank) {
  if (!visible) return std::to_string(local_rank);
  std::vector<std::string> ids;
  size_t start = 0;
  for (;;) {
    const size_t comma = visible->find(',', start);
    std::string id = visible->substr(start, comma == std::string::npos ? comma : comma - start);
    id.erase(0, id.find_first_not_of(" \t"));
    id.erase(id.find_last_not_of(" \t") + 1);
    ids.push_back(id);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (local_rank >= static_cast<int>(ids.size())) {
    throw UsageError(fmt::format(
        "--virtual-local-rank: local rank {} has no GPU in CUDA_VISIBLE_DEVICES={} ({} listed); "
        "list one GPU per worker, or run fewer workers per node",
        local_rank, *visible, ids.size()));
  }
  return ids[static_cast<size_t>(local_rank)];
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
