// ddprun's command-line parser as JSON, for tests/launcher/torchrun_parity_test.py: parses the
// arguments with the process environment (PET_* variables) exactly as ddprun does, and prints
// one JSON object: the fields torchrun's parser also decides, or {"error": message} for a
// usage error. Exit 0 either way.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/launcher/cli.hpp"
#include "ddp/util/error.hpp"

int main(int argc, char** argv) {
  using namespace ddp::launcher;
  nlohmann::json out;
  try {
    ParsedCommandLine p =
        parse_command_line(std::vector<std::string>(argv + 1, argv + argc), process_env());
    if (!p.options) {
      out["error"] = "not a launch";
    } else {
      const LaunchOptions& o = *p.options;
      auto std_text = [](const StdSpec& s) {
        if (s.per_rank.empty()) return std::to_string(static_cast<int>(s.all));
        std::string text;
        for (const auto& [rank, streams] : s.per_rank) {
          text += (text.empty() ? "" : ",") + std::to_string(rank) + ":" +
                  std::to_string(static_cast<int>(streams));
        }
        return text;
      };
      out = {{"nnodes", std::to_string(o.nnodes_min) + ":" + std::to_string(o.nnodes)},
             {"nproc_per_node", o.nproc_per_node},
             {"rdzv_backend", o.rdzv_backend},
             {"rdzv_endpoint", o.rdzv_endpoint.value_or("")},
             {"rdzv_id", o.run_id},
             {"rdzv_conf", o.rdzv_conf},
             {"standalone", o.standalone},
             {"max_restarts", o.max_restarts},
             {"monitor_interval", o.monitor_interval_s},
             {"role", o.role},
             {"module", o.module},
             {"no_python", o.no_python},
             {"run_path", o.run_path},
             {"log_dir", o.log_dir ? nlohmann::json(*o.log_dir) : nlohmann::json(nullptr)},
             {"redirects", std_text(o.redirects)},
             {"tee", std_text(o.tee)},
             {"local_ranks_filter", o.local_ranks_filter ? nlohmann::json(*o.local_ranks_filter)
                                                         : nlohmann::json(nullptr)},
             {"duplicate_stdout_filters", o.duplicate_stdout_filters},
             {"duplicate_stderr_filters", o.duplicate_stderr_filters},
             {"node_rank", o.node_rank},
             {"master_addr", o.master_addr},
             {"master_port",
              o.given.master_port ? nlohmann::json(o.master_port) : nlohmann::json(nullptr)},
             {"local_addr", o.local_addr ? nlohmann::json(*o.local_addr) : nlohmann::json(nullptr)},
             {"numa_binding", o.placement.numa_binding
                                  ? nlohmann::json(to_string(*o.placement.numa_binding))
                                  : nlohmann::json(nullptr)},
             {"signals_to_handle", o.signals_to_handle},
             {"shutdown_timeout", o.term_grace.count() / 1000.0},
             {"virtual_local_rank", o.placement.virtual_local_rank},
             {"event_log_handler", o.event_log_handler},
             {"training_script", o.program},
             {"training_script_args", o.program_args}};
    }
  } catch (const ddp::UsageError& e) {
    out = {{"error", e.what()}};
  }
  std::puts(out.dump().c_str());
  return 0;
}
