// ddp-doctor: runs the doctor checks and prints one verdict per line (exit 1 if any check
// fails, 2 on bad usage). With --serve it instead hosts a store with a clock beacon, so the
// doctors of the other nodes have something real to connect to before training starts.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "ddp/cluster/clock_beacon.hpp"
#include "ddp/cluster/doctor.hpp"
#include "ddp/store/auth.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/error.hpp"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop.store(true);
}

// Hosts the store and the beacon until `seconds` pass or SIGINT/SIGTERM arrives.
int serve(const std::string& endpoint, const std::optional<std::string>& token, int seconds) {
  auto [host, port] = ddp::cluster::parse_endpoint(endpoint);
  ddp::TcpStoreServerOptions server_options;
  server_options.host = host;
  server_options.port = port;
  server_options.token = token;
  ddp::TcpStoreServer server(server_options);
  server.start();
  ddp::TcpStoreOptions client_options;
  client_options.host = (host == "0.0.0.0" || host == "::") ? "127.0.0.1" : host;
  client_options.port = server.port();
  client_options.token = token;
  client_options.timeout = std::chrono::seconds(10);
  auto client = std::make_shared<ddp::TcpStore>(client_options);
  ddp::cluster::ClockBeacon beacon(client);
  std::cout << "ddp-doctor: serving a store with a clock on " << host << ":" << server.port()
            << " for " << seconds << " s; run `ddp-doctor --endpoint <this host>:" << server.port()
            << "` on the other nodes" << std::endl;
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!g_stop.load() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ddp-doctor: check name resolution, routes, the master's store, clocks, GPUs and "
      "interface variables before a multi-node run"};
  ddp::cluster::DoctorOptions options;
  std::string endpoint, token, serve_endpoint;
  int timeout_ms = static_cast<int>(options.timeout.count());
  int serve_seconds = 600;
  bool json = false;
  app.add_option("--endpoint", endpoint,
                 "HOST:PORT of the master's store (default: MASTER_ADDR:MASTER_PORT)");
  std::string token_file;
  // Refused: a secret on the command line is readable by every local user (/proc/PID/cmdline).
  auto* token_opt =
      app.add_option("--token", token, "refused: use --token-file or $DDP_STORE_TOKEN");
  auto* token_file_opt = app.add_option(
      "--token-file", token_file,
      "file holding the store token, mode 600 (default: $DDP_STORE_TOKEN, else the file "
      "$DDP_STORE_TOKEN_FILE names)");
  app.add_option("--timeout-ms", timeout_ms, "limit for each network step")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  app.add_flag("--json", json, "one JSON object per check instead of text");
  auto* serve_opt = app.add_option(
      "--serve", serve_endpoint,
      "host a store with a clock beacon on HOST:PORT (0.0.0.0:29500 for every interface)");
  app.add_option("--serve-seconds", serve_seconds, "how long --serve runs")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (token_opt->count() > 0) {
    std::cerr << "ddp-doctor: --token puts the store's secret on the command line, where every "
                 "local user can read it (/proc/PID/cmdline); pass --token-file FILE (mode 600) "
                 "or set DDP_STORE_TOKEN instead\n";
    return 2;
  }
  std::optional<std::string> token_value;
  try {
    if (token_file_opt->count() > 0) {
      token_value = ddp::store_auth::read_token_file(token_file, "--token-file " + token_file);
    }
    if (serve_opt->count() > 0) return serve(serve_endpoint, token_value, serve_seconds);
    if (!endpoint.empty()) options.endpoint = endpoint;
    options.token = token_value;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    auto results = ddp::cluster::run_doctor(options);
    if (json) {
      for (const auto& r : results) {
        std::cout << nlohmann::json{{"check", r.name},
                                    {"status", ddp::cluster::to_string(r.status)},
                                    {"verdict", r.verdict}}
                         .dump()
                  << "\n";
      }
    } else {
      ddp::cluster::print_doctor_report(std::cout, results);
    }
    return ddp::cluster::doctor_exit_code(results);
  } catch (const ddp::Error& e) {
    std::cerr << "ddp-doctor: " << e.what() << "\n";
    return 2;
  }
}
