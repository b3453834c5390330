// Doctor checks on the environment: cluster detection, socket-interface variables that name
// missing interfaces, MASTER_ADDR / MASTER_PORT that point at nothing.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ddp/util/error.hpp"
#include "doctor_checks.hpp"

namespace ddp::cluster::detail {

namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    if (end > begin) out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

// "eth0 192.0.2.2, lo 127.0.0.1" (first address of each, down interfaces marked).
std::string describe(const std::vector<NetInterface>& interfaces) {
  std::vector<std::string> parts;
  for (const auto& i : interfaces) {
    std::string part = i.name;
    if (!i.addresses.empty()) part += " " + i.addresses.front();
    if (!i.up) part += " (down)";
    parts.push_back(part);
  }
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

std::vector<std::string> names_of(const std::vector<NetInterface>& interfaces) {
  std::vector<std::string> names;
  for (const auto& i : interfaces) names.push_back(i.name);
  return names;
}

// Interfaces a NCCL_SOCKET_IFNAME value selects: a comma list of name prefixes; "=" in front
// makes them exact names, "^" in front excludes them instead (NCCL's documented syntax).
std::vector<NetInterface> nccl_selection(const std::string& value,
                                         const std::vector<NetInterface>& interfaces) {
  std::string spec = value;
  bool exclude = false;
  bool exact = false;
  if (!spec.empty() && spec[0] == '^') {
    exclude = true;
    spec = spec.substr(1);
  }
  if (!spec.empty() && spec[0] == '=') {
    exact = true;
    spec = spec.substr(1);
  }
  std::vector<std::string> patterns = split_commas(spec);
  std::vector<NetInterface> selected;
  for (const auto& itf : interfaces) {
    bool match = std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
      return exact ? itf.name == p : itf.name.rfind(p, 0) == 0;
    });
    if (match != exclude) selected.push_back(itf);
  }
  return selected;
}

CheckResult check_nccl_ifname(const std::string& value,
                              const std::vector<NetInterface>& interfaces) {
  const std::string name = "NCCL_SOCKET_IFNAME";
  std::vector<NetInterface> selected = nccl_selection(value, interfaces);
  std::vector<NetInterface> usable;
  for (const auto& i : selected) {
    if (i.up && !i.addresses.empty()) usable.push_back(i);
  }
  if (usable.empty()) {
    return {
        name, CheckStatus::kFail,
        fmt::format("{}={} selects no usable interface ({}); this node has: {}. Name one of "
                    "them (a prefix, '=' for exact names, '^' to exclude)",
                    name, value, selected.empty() ? "no name matches" : "all down or no address",
                    describe(interfaces))};
  }
  return {name, CheckStatus::kOk, fmt::format("{}={} selects {}", name, value, describe(usable))};
}

// GLOO_SOCKET_IFNAME / DDP_GLOO_IFNAME: comma-separated exact interface names.
CheckResult check_exact_ifnames(const std::string& name, const std::string& value,
                                const std::vector<NetInterface>& interfaces) {
  std::vector<std::string> missing, down;
  std::vector<NetInterface> found;
  for (const auto& want : split_commas(value)) {
    auto it = std::find_if(interfaces.begin(), interfaces.end(),
                           [&](const NetInterface& i) { return i.name == want; });
    if (it == interfaces.end()) {
      missing.push_back(want);
    } else if (!it->up || it->addresses.empty()) {
      down.push_back(want);
    } else {
      found.push_back(*it);
    }
  }
  if (!missing.empty() || found.empty()) {
    return {name, CheckStatus::kFail,
            fmt::format("{}={}: {} on this node; it has: {}. Set it to one of those names or "
                        "unset it",
                        name, value,
                        missing.empty()
                            ? fmt::format("{} down or without address", fmt::join(down, ", "))
                            : fmt::format("no interface named {}", fmt::join(missing, ", ")),
                        fmt::join(names_of(interfaces), ", "))};
  }
  if (!down.empty()) {
    return {name, CheckStatus::kWarn,
            fmt::format("{}={}: {} down or without address; using {}", name, value,
                        fmt::join(down, ", "), describe(found))};
  }
  return {name, CheckStatus::kOk, fmt::format("{}={} is {}", name, value, describe(found))};
}

}  // namespace

CheckResult check_cluster(const EnvMap& env, const DetectOptions& options) {
  try {
    ClusterInfo info = detect_cluster(env, options);
    if (!info.warnings.empty()) {
      return {"cluster", CheckStatus::kWarn,
              fmt::format("{}; {}", info.explanation, fmt::join(info.warnings, "; "))};
    }
    return {"cluster", CheckStatus::kOk, info.explanation};
  } catch (const Error& e) {
    return {"cluster", CheckStatus::kFail, e.what()};
  }
}

std::vector<CheckResult> check_environment(const EnvMap& env,
                                           const std::vector<NetInterface>& interfaces,
                                           std::chrono::milliseconds timeout) {
  std::vector<CheckResult> results;
  bool any_ifname = false;
  if (auto v = lookup(env, "NCCL_SOCKET_IFNAME")) {
    any_ifname = true;
    results.push_back(check_nccl_ifname(*v, interfaces));
  }
  for (const char* name : {"GLOO_SOCKET_IFNAME", "DDP_GLOO_IFNAME"}) {
    if (auto v = lookup(env, name)) {
      any_ifname = true;
      results.push_back(check_exact_ifnames(name, *v, interfaces));
    }
  }
  if (!any_ifname) {
    results.push_back({"interfaces", CheckStatus::kOk,
                       fmt::format("no NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / DDP_GLOO_IFNAME "
                                   "set; this node has: {}",
                                   describe(interfaces))});
  }

  if (auto addr = lookup(env, "MASTER_ADDR")) {
    try {
      auto addresses = resolve_host(*addr, timeout);
      results.push_back(
          {"MASTER_ADDR", CheckStatus::kOk,
           fmt::format("MASTER_ADDR={} resolves to {}", *addr, fmt::join(addresses, ", "))});
    } catch (const Error& e) {
      results.push_back(
          {"MASTER_ADDR", CheckStatus::kFail, fmt::format("MASTER_ADDR={}: {}", *addr, e.what())});
    }
  }
  if (auto port = lookup(env, "MASTER_PORT")) {
    char* end = nullptr;
    long value = std::strtol(port->c_str(), &end, 10);
    if (*end != '\0' || value < 1 || value > 65535) {
      results.push_back({"MASTER_PORT", CheckStatus::kFail,
                         fmt::format("MASTER_PORT={} is not a port number (1-65535)", *port)});
    } else {
      results.push_back({"MASTER_PORT", CheckStatus::kOk, fmt::format("MASTER_PORT={}", value)});
    }
  }
  return results;
}

}  // namespace ddp::cluster::detail
