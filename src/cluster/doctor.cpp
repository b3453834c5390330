// run_doctor: runs the check groups in order; the printer and endpoint parsing.
#include "ddp/cluster/doctor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "ddp/util/error.hpp"
#include "doctor_checks.hpp"

namespace ddp::cluster {

const char* to_string(CheckStatus status) {
  switch (status) {
    case CheckStatus::kOk:
      return "ok";
    case CheckStatus::kWarn:
      return "warn";
    case CheckStatus::kFail:
      return "FAIL";
    case CheckStatus::kSkip:
      return "skip";
  }
  return "?";
}

std::pair<std::string, uint16_t> parse_endpoint(const std::string& endpoint) {
  constexpr uint16_t kDefaultPort = 29500;
  std::string host = endpoint;
  std::string port_text;
  if (!endpoint.empty() && endpoint[0] == '[') {
    size_t close = endpoint.find(']');
    if (close == std::string::npos) {
      throw UsageError(
          fmt::format("endpoint '{}': missing ']' after the IPv6 address; write "
                      "[addr]:port",
                      endpoint));
    }
    host = endpoint.substr(1, close - 1);
    if (close + 1 < endpoint.size()) {
      if (endpoint[close + 1] != ':') {
        throw UsageError(fmt::format("endpoint '{}': expected ':' after ']'", endpoint));
      }
      port_text = endpoint.substr(close + 2);
    }
  } else if (std::count(endpoint.begin(), endpoint.end(), ':') == 1) {
    host = endpoint.substr(0, endpoint.find(':'));
    port_text = endpoint.substr(endpoint.find(':') + 1);
  } else if (endpoint.find(':') != std::string::npos) {
    throw UsageError(
        fmt::format("endpoint '{}': an IPv6 address needs brackets, e.g. [::1]:29500", endpoint));
  }
  if (host.empty()) {
    throw UsageError(fmt::format("endpoint '{}' has no host: write HOST:PORT", endpoint));
  }
  if (port_text.empty() && endpoint.find(':') == std::string::npos) return {host, kDefaultPort};
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port < 0 || port > 65535) {
    throw UsageError(fmt::format("endpoint '{}': port '{}' is not a number from 0 to 65535",
                                 endpoint, port_text));
  }
  return {host, static_cast<uint16_t>(port)};
}

std::vector<CheckResult> run_doctor(const DoctorOptions& options) {
  const EnvMap env = options.env ? *options.env : current_environment();

  // The endpoint is parsed first so a malformed one is a UsageError before any check runs.
  std::optional<std::pair<std::string, uint16_t>> endpoint;
  std::string no_endpoint_reason;
  if (options.endpoint) {
    endpoint = parse_endpoint(*options.endpoint);
    if (endpoint->second == 0) {
      throw UsageError(
          fmt::format("endpoint '{}': port 0 cannot be connected to; give the "
                      "store's port",
                      *options.endpoint));
    }
  } else if (auto addr = lookup(env, "MASTER_ADDR"); addr && lookup(env, "MASTER_PORT")) {
    try {
      bool bare_v6 = addr->find(':') != std::string::npos && (*addr)[0] != '[';
      endpoint =
          parse_endpoint((bare_v6 ? "[" + *addr + "]" : *addr) + ":" + *lookup(env, "MASTER_PORT"));
    } catch (const UsageError&) {
      no_endpoint_reason = "MASTER_ADDR/MASTER_PORT do not form HOST:PORT (see MASTER_PORT)";
    }
  } else {
    no_endpoint_reason =
        "no endpoint: pass --endpoint HOST:PORT (the master's store) or set MASTER_ADDR and "
        "MASTER_PORT";
  }

  std::vector<CheckResult> results;
  results.push_back(detail::check_cluster(env, options.detect));
  std::vector<NetInterface> interfaces;
  try {
    interfaces = list_interfaces();
  } catch (const Error& e) {
    results.push_back({"interfaces", CheckStatus::kFail, e.what()});
  }
  for (auto& r : detail::check_environment(env, interfaces, options.timeout)) {
    results.push_back(std::move(r));
  }
  for (auto& r : detail::check_gpus(env, options.nvidia_dir, options.nccl_library)) {
    results.push_back(std::move(r));
  }
  results.push_back(detail::check_blas(options.blas_library));
  if (endpoint) {
    for (auto& r : detail::check_endpoint(endpoint->first, endpoint->second, options.token,
                                          options.timeout, env)) {
      results.push_back(std::move(r));
    }
  } else {
    results.push_back({"endpoint", CheckStatus::kSkip, no_endpoint_reason});
  }
  return results;
}

void print_doctor_report(std::ostream& out, const std::vector<CheckResult>& results) {
  int counts[4] = {0, 0, 0, 0};
  for (const auto& r : results) {
    out << fmt::format("[{:^4}] {:<19} {}\n", to_string(r.status), r.name, r.verdict);
    ++counts[static_cast<int>(r.status)];
  }
  out << fmt::format("doctor: {} ok, {} warn, {} failed, {} skipped\n", counts[0], counts[1],
                     counts[2], counts[3]);
}

int doctor_exit_code(const std::vector<CheckResult>& results) {
  for (const auto& r : results) {
    if (r.status == CheckStatus::kFail) return 1;
  }
  return 0;
}

}  // namespace ddp::cluster
