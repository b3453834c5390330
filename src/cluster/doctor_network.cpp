// Doctor checks against the endpoint (the master's store): resolve, route, connect,
// store-auth, clock-skew. Only the endpoint is contacted; each step is bounded by `timeout`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "ddp/cluster/clock_beacon.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"
#include "doctor_checks.hpp"

#if __has_include("ddp/store/tcp_store.hpp")
#include "ddp/store/auth.hpp"
#include "ddp/store/tcp_store.hpp"
#define DDP_DOCTOR_HAVE_TCP_STORE 1
#endif

namespace ddp::cluster::detail {

std::string format_ms(std::chrono::steady_clock::duration d) {
  double ms = std::chrono::duration<double, std::milli>(d).count();
  return ms < 10 ? fmt::format("{:.2f} ms", ms) : fmt::format("{:.0f} ms", ms);
}

namespace {

bool is_loopback_name(const std::string& host) {
  return host == "localhost" || host == "ip6-localhost" || is_loopback_address(host);
}

CheckResult skipped(const std::string& name, const std::string& reason) {
  return {name, CheckStatus::kSkip, reason};
}

#ifdef DDP_DOCTOR_HAVE_TCP_STORE
// Reads the clock beacon twice (to see it is alive) and estimates the offset of the store
// host's wall clock from ours, Cristian-style.
CheckResult check_clock(TcpStore& store, const std::string& endpoint,
                        std::chrono::milliseconds timeout) {
  const std::string name = "clock-skew";
  const std::string key = ClockBeacon::kClockKey;
  if (!store.check({key})) {
    return skipped(name, fmt::format("the store at {} publishes no clock ({} unset); "
                                     "`ddp-doctor --serve` on the master publishes one",
                                     endpoint, key));
  }
  std::string first = store.get(key, timeout);
  std::this_thread::sleep_for(3 * ClockBeacon::kPeriod);
  auto wall0 = ClockBeacon::wall_ms();
  auto t0 = std::chrono::steady_clock::now();
  std::string second = store.get(key, timeout);
  auto rtt = std::chrono::steady_clock::now() - t0;
  if (second == first) {
    return skipped(name, fmt::format("the clock at {} ({}) is not being updated: its publisher "
                                     "stopped",
                                     endpoint, key));
  }
  int64_t theirs = 0;
  try {
    theirs = std::stoll(second);
  } catch (const std::exception&) {
    return {name, CheckStatus::kWarn,
            fmt::format("{} at {} holds '{}', not a time in ms", key, endpoint, second)};
  }
  double rtt_ms = std::chrono::duration<double, std::milli>(rtt).count();
  // The value is on average half a period old when read; the uncertainty keeps a full one.
  double period_ms = static_cast<double>(ClockBeacon::kPeriod.count());
  double skew =
      static_cast<double>(theirs) + period_ms / 2 - (static_cast<double>(wall0) + rtt_ms / 2);
  double uncertainty = rtt_ms / 2 + period_ms;
  std::string text = fmt::format("the store host's clock is {:+.0f} ms from ours (+-{:.0f} ms)",
                                 skew, uncertainty);
  double least = std::fabs(skew) - uncertainty;  // the smallest skew consistent with the reading
  if (least > 30000) {
    return {name, CheckStatus::kFail,
            text +
                ": timestamps, heartbeats and logs disagree across nodes; sync the clocks "
                "(chrony/NTP)"};
  }
  if (least > 1000) {
    return {name, CheckStatus::kWarn, text + ": logs will be hard to correlate; sync the clocks"};
  }
  return {name, CheckStatus::kOk, text};
}
#endif

}  // namespace

std::vector<CheckResult> check_endpoint(const std::string& host, uint16_t port,
                                        const std::optional<std::string>& token,
                                        std::chrono::milliseconds timeout, const EnvMap& env) {
  std::vector<CheckResult> results;
  const std::string endpoint = net::format_endpoint(host, port);
  auto skip_rest = [&](const std::string& reason) {
    for (const char* name : {"route", "connect", "store-auth", "clock-skew"}) {
      bool done = std::any_of(results.begin(), results.end(),
                              [&](const CheckResult& r) { return r.name == name; });
      if (!done) results.push_back(skipped(name, reason));
    }
    return results;
  };

  // resolve
  std::vector<std::string> addresses;
  try {
    auto t0 = std::chrono::steady_clock::now();
    addresses = resolve_host(host, timeout);
    std::string text = fmt::format("{} resolves to {} ({})", host, fmt::join(addresses, ", "),
                                   format_ms(std::chrono::steady_clock::now() - t0));
    bool all_loopback = std::all_of(addresses.begin(), addresses.end(), is_loopback_address);
    if (all_loopback && !is_loopback_name(host)) {
      results.push_back(
          {"resolve", CheckStatus::kWarn,
           text + ": only loopback here, so this name means this machine; other nodes cannot "
                  "reach it this way. Fix /etc/hosts (Debian maps the host name to 127.0.1.1) "
                  "or use the node's IP address"});
    } else {
      results.push_back({"resolve", CheckStatus::kOk, text});
    }
  } catch (const Error& e) {
    results.push_back({"resolve", CheckStatus::kFail, e.what()});
    return skip_rest(fmt::format("{} does not resolve", host));
  }

  // route
  try {
    RouteInfo route = route_to(addresses.front());
    std::string via = route.interface.empty() ? "an unknown interface" : route.interface;
    std::string text =
        fmt::format("{} is reached from {} via {}", addresses.front(), route.local_address, via);
    std::optional<std::string> pinned;
    for (const char* var : {"GLOO_SOCKET_IFNAME", "DDP_GLOO_IFNAME"}) {
      if (auto v = lookup(env, var)) pinned = std::string(var) + "=" + *v;
    }
    if (pinned && !route.interface.empty() && route.interface != "lo" &&
        pinned->find("=" + route.interface) == std::string::npos) {
      results.push_back({"route", CheckStatus::kWarn,
                         text + fmt::format(", but {} pins another interface: peers may be "
                                            "unreachable from it",
                                            *pinned)});
    } else {
      results.push_back({"route", CheckStatus::kOk, text});
    }
  } catch (const Error& e) {
    results.push_back({"route", CheckStatus::kFail, e.what()});
    return skip_rest(fmt::format("no route to {}", addresses.front()));
  }

  // connect: each address in turn, like a client would
  std::string connected;
  std::string last_error;
  bool timed_out = false;
  for (const auto& address : addresses) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      net::Socket sock = net::connect_tcp(address, port, t0 + timeout);
      connected = address;
      results.push_back({"connect", CheckStatus::kOk,
                         fmt::format("connected to {} in {}", net::format_endpoint(address, port),
                                     format_ms(std::chrono::steady_clock::now() - t0))});
      break;
    } catch (const TimeoutError& e) {
      timed_out = true;
      last_error = e.what();
    } catch (const NetworkError& e) {
      last_error = e.what();
    }
  }
  if (connected.empty()) {
    std::string fix =
        timed_out ? fmt::format(
                        "no answer within {} ms: a firewall drops the packets, or the address "
                        "is not the master's",
                        timeout.count())
                  : fmt::format(
                        "nothing accepts connections on port {} there: start the master "
                        "first (ddprun on node 0, or ddp-doctor --serve), or check the port",
                        port);
    results.push_back({"connect", CheckStatus::kFail, fmt::format("{}; {}", last_error, fix)});
    return skip_rest(fmt::format("cannot connect to {}", endpoint));
  }

#ifdef DDP_DOCTOR_HAVE_TCP_STORE
  // store-auth: the full client handshake, with the token the workers would use
  TcpStoreOptions store_options;
  store_options.host = connected;
  store_options.port = port;
  store_options.timeout = timeout;
  // The token the workers would use: the explicit one (read from --token-file), else
  // DDP_STORE_TOKEN from the checked environment (which may not be this process's), else the
  // file DDP_STORE_TOKEN_FILE names (ddprun's workers get it from token_file=), else none.
  std::string used = "no token";
  if (token) {
    store_options.token = *token;
    used = token->empty() ? "no token (an empty one was given)" : "--token-file";
  } else if (auto value = lookup(env, store_auth::kTokenEnvVar); value && !value->empty()) {
    store_options.token = *value;
    used = store_auth::kTokenEnvVar;
  } else if (auto path = lookup(env, store_auth::kTokenFileEnvVar); path && !path->empty()) {
    try {
      store_options.token = store_auth::read_token_file_variable(*path);
    } catch (const UsageError& e) {
      results.push_back({"store-auth", CheckStatus::kFail, e.what()});
      return skip_rest("no token to try");
    }
    used = store_auth::kTokenFileEnvVar;
  } else {
    store_options.token = "";
  }
  std::unique_ptr<TcpStore> store;
  try {
    auto t0 = std::chrono::steady_clock::now();
    store = std::make_unique<TcpStore>(store_options);
    results.push_back({"store-auth", CheckStatus::kOk,
                       fmt::format("the store at {} accepted this client ({}) in {}", endpoint,
                                   used, format_ms(std::chrono::steady_clock::now() - t0))});
  } catch (const StoreError& e) {
    results.push_back({"store-auth", CheckStatus::kFail, e.what()});
    return skip_rest("the store refused this client");
  } catch (const Error& e) {
    results.push_back(
        {"store-auth", CheckStatus::kFail,
         fmt::format("{} accepts TCP but did not complete the ddp store handshake within {} ms "
                     "({}): is a ddp store listening there? (PyTorch's TCPStore speaks another "
                     "protocol)",
                     endpoint, timeout.count(), e.what())});
    return skip_rest("no store handshake");
  }

  // clock-skew
  try {
    results.push_back(check_clock(*store, endpoint, timeout));
  } catch (const Error& e) {
    results.push_back({"clock-skew", CheckStatus::kWarn,
                       fmt::format("reading the clock from {} failed: {}", endpoint, e.what())});
  }
#else
  (void)token;
  results.push_back(skipped("store-auth", "this build has no TcpStore client"));
  results.push_back(skipped("clock-skew", "this build has no TcpStore client"));
#endif
  return results;
}

}  // namespace ddp::cluster::detail
