#include "ddp/rendezvous/options.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "ddp/store/auth.hpp"
#include "ddp/util/error.hpp"

namespace ddp::rdzv {

namespace {

bool parse_int(const std::string& text, long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtol(text.c_str(), &end, 10);
  return errno == 0 && end == text.c_str() + text.size();
}

Millis parse_seconds(const std::string& key, const std::string& value) {
  char* end = nullptr;
  double s = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(s) || s <= 0 ||
      s > 1e7) {
    throw UsageError(fmt::format(
        "--rdzv-conf {}={}: expected a positive number of seconds, e.g. {}=30", key, value, key));
  }
  return Millis(static_cast<int64_t>(std::llround(s * 1000.0)));
}

}  // namespace

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::kStatic:
      return "static";
    case Backend::kEtcd:
      return "etcd";
    case Backend::kEtcdV2:
      return "etcd-v2";
    case Backend::kC10d:
      break;
  }
  return "c10d";
}

Backend parse_backend(const std::string& text) {
  if (text == "c10d" || text == "c10d-experimental") return Backend::kC10d;
  if (text == "static") return Backend::kStatic;
  if (text == "etcd") return Backend::kEtcd;
  if (text == "etcd-v2") return Backend::kEtcdV2;
  throw UsageError(fmt::format(
      "--rdzv-backend {}: unknown backend; use c10d (elastic, node ranks in join order), etcd "
      "or etcd-v2 (elastic, the store an etcd cluster) or static (fixed --node-rank)",
      text));
}

NodeRange parse_nnodes(const std::string& text) {
  NodeRange r;
  auto colon = text.find(':');
  long a = 0, b = 0;
  bool ok = colon == std::string::npos
                ? parse_int(text, a) && (b = a, true)
                : parse_int(text.substr(0, colon), a) && parse_int(text.substr(colon + 1), b);
  if (!ok || a < 1 || b < a || b > 1000000) {
    throw UsageError(
        fmt::format("--nnodes {}: expected N or MIN:MAX with 1 <= MIN <= MAX (e.g. --nnodes 2 or "
                    "--nnodes 2:4)",
                    text));
  }
  r.min = static_cast<int>(a);
  r.max = static_cast<int>(b);
  return r;
}

Endpoint parse_endpoint(const std::string& text, uint16_t default_port) {
  Endpoint e;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos) {
      throw UsageError(fmt::format("--rdzv-endpoint {}: missing ']' after the IPv6 address", text));
    }
    e.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        throw UsageError(fmt::format("--rdzv-endpoint {}: expected [ADDR]:PORT", text));
      }
      port = text.substr(close + 2);
    }
  } else {
    auto colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') != colon) {
      throw UsageError(fmt::format(
          "--rdzv-endpoint {}: write IPv6 addresses in brackets, e.g. [::1]:29400", text));
    }
    e.host = text.substr(0, colon);
    if (colon != std::string::npos) port = text.substr(colon + 1);
  }
  if (e.host.empty()) {
    throw UsageError(fmt::format("--rdzv-endpoint '{}': no host; expected HOST[:PORT]", text));
  }
  e.port = default_port;
  if (!port.empty() || (text.find(':') != std::string::npos && text.back() == ':')) {
    long p = 0;
    if (!parse_int(port, p) || p < 0 || p > 65535) {
      throw UsageError(
          fmt::format("--rdzv-endpoint {}: port '{}' is not a number in 0..65535", text, port));
    }
    e.port = static_cast<uint16_t>(p);
  }
  return e;
}

std::vector<Endpoint> parse_endpoints(const std::string& text, uint16_t default_port) {
  std::vector<Endpoint> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) {
      throw UsageError(fmt::format(
          "--rdzv-endpoint {}: empty entry; expected HOST[:PORT][,HOST[:PORT]...]", text));
    }
    out.push_back(parse_endpoint(item, default_port));
  }
  if (out.empty()) throw UsageError("--rdzv-endpoint: empty; expected HOST[:PORT]");
  return out;
}

RendezvousConf parse_rdzv_conf(const std::string& text) {
  RendezvousConf conf;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw UsageError(fmt::format("--rdzv-conf '{}': expected key=value", item));
    }
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    auto path = [&] {
      if (value.empty())
        throw UsageError(fmt::format("--rdzv-conf {}=: expected a file path", key));
      conf.etcd_keys.push_back(key);
      return value;
    };
    if (key == "join_timeout") {
      conf.join_timeout = parse_seconds(key, value);
      conf.join_timeout_given = true;
    } else if (key == "protocol") {
      if (value != "http" && value != "https") {
        throw UsageError(fmt::format("--rdzv-conf protocol={}: expected http or https", value));
      }
      conf.https = value == "https";
      conf.etcd_keys.push_back(key);
    } else if (key == "cacert") {
      conf.cacert = path();
    } else if (key == "cert") {
      conf.cert = path();
    } else if (key == "key") {
      conf.key = path();
    } else if (key == "etcd_prefix") {
      if (value.empty() || value.find_first_of("\t\n") != std::string::npos) {
        throw UsageError(
            fmt::format("--rdzv-conf etcd_prefix='{}': expected a non-empty key prefix", value));
      }
      conf.etcd_prefix = value;
      conf.etcd_keys.push_back(key);
    } else if (key == "key_ttl" || key == "ttl") {
      conf.key_ttl = parse_seconds(key, value);
      conf.etcd_keys.push_back(key);
    } else if (key == "read_timeout") {
      // Also torchrun's c10d key (the store's timeout): the one request limit for both.
      conf.read_timeout = parse_seconds(key, value);
    } else if (key == "timeout") {
      // torchrun's etcd backend: its join timeout; c10d ignores it, as torchrun's c10d does.
      conf.timeout = parse_seconds(key, value);
    } else if (key == "last_call_timeout") {
      conf.last_call_timeout = parse_seconds(key, value);
    } else if (key == "close_timeout") {
      conf.close_timeout = parse_seconds(key, value);
    } else if (key == "heartbeat" || key == "keep_alive_interval") {
      conf.heartbeat = parse_seconds(key, value);
    } else if (key == "connect_timeout") {
      conf.connect_timeout = parse_seconds(key, value);
    } else if (key == "token_file") {
      if (value.empty()) throw UsageError("--rdzv-conf token_file=: expected a file path");
      conf.token_file = value;
    } else if (key == "standby_stores") {
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 0 || n > 16) {
        throw UsageError(fmt::format(
            "--rdzv-conf standby_stores={}: expected a count from 0 (none) to 16", value));
      }
      conf.standby_stores = static_cast<int>(n);
      conf.standby_stores_given = true;
    } else if (key == "is_host") {
      // torchrun's c10d keys that have no meaning here are accepted and ignored, so existing
      // job scripts keep working.
    } else {
      throw UsageError(fmt::format(
          "--rdzv-conf {}: unknown key '{}'; known keys: join_timeout, last_call_timeout, "
          "close_timeout, heartbeat, connect_timeout, read_timeout, token_file, "
          "standby_stores; with the etcd backends also protocol, cacert, cert, key, etcd_prefix, "
          "key_ttl, timeout",
          item, key));
    }
  }
  return conf;
}

std::string read_token_file(const std::string& path) {
  return store_auth::read_token_file(path, "--rdzv-conf token_file=" + path);
}

void validate_run_id(const std::string& run_id) {
  if (run_id.empty()) throw UsageError("--rdzv-id: empty; give every node the same job id");
  for (char c : run_id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != ':' &&
        c != '-') {
      throw UsageError(fmt::format(
          "--rdzv-id '{}': character '{}' is not allowed; use letters, digits and _ . : -", run_id,
          c));
    }
  }
  if (run_id.size() > 128) throw UsageError("--rdzv-id: longer than 128 characters");
}

void validate(const RendezvousOptions& o) {
  validate_run_id(o.run_id);
  if (o.nodes.min < 1 || o.nodes.max < o.nodes.min) {
    throw UsageError(
        fmt::format("--nnodes {}:{}: expected 1 <= MIN <= MAX", o.nodes.min, o.nodes.max));
  }
  if (o.backend == Backend::kStatic) {
    if (o.nodes.min != o.nodes.max) {
      throw UsageError(fmt::format(
          "--nnodes {}:{} with --rdzv-backend static: the static backend needs a fixed node "
          "count; use --rdzv-backend c10d for an elastic range",
          o.nodes.min, o.nodes.max));
    }
    if (o.node_rank < 0 || o.node_rank >= o.nodes.max) {
      throw UsageError(
          fmt::format("--node-rank {} with --nnodes {}: give each node a distinct rank in 0..{}",
                      o.node_rank, o.nodes.max, o.nodes.max - 1));
    }
  }
  if (o.local_world_size < 1) {
    throw UsageError(fmt::format("--nproc-per-node {}: must be at least 1", o.local_world_size));
  }
  for (auto [name, v] : {std::pair{"join_timeout", o.conf.join_timeout},
                         {"last_call_timeout", o.conf.last_call_timeout},
                         {"close_timeout", o.conf.close_timeout},
                         {"heartbeat", o.conf.heartbeat},
                         {"connect_timeout", o.conf.connect_timeout}}) {
    if (v.count() <= 0) {
      throw UsageError(fmt::format("--rdzv-conf {}: must be positive", name));
    }
  }
  if (uses_etcd(o.backend)) {
    const RendezvousConf& c = o.conf;
    if (!c.https && (c.cacert || c.cert || c.key)) {
      throw UsageError(
          fmt::format("--rdzv-conf {}=...: TLS files need protocol=https (etcd's https client URL)",
                      c.cacert ? "cacert"
                      : c.cert ? "cert"
                               : "key"));
    }
    if (c.key && !c.cert) {
      throw UsageError("--rdzv-conf key=FILE without cert=FILE: give the client certificate too");
    }
    if (c.token_file) {
      throw UsageError(
          "--rdzv-conf token_file: the etcd backends authenticate with TLS client certificates "
          "(protocol=https,cacert=,cert=,key=), not a token");
    }
    if (c.key_ttl < Millis(3000)) {
      throw UsageError(
          "--rdzv-conf key_ttl: at least 3 seconds (the agents renew the lease every third)");
    }
  } else if (!o.conf.etcd_keys.empty()) {
    throw UsageError(fmt::format(
        "--rdzv-conf {}: only the etcd backends take this key (--rdzv-backend etcd or etcd-v2), "
        "not {}",
        o.conf.etcd_keys.front(), to_string(o.backend)));
  }
  // c10d: standbys of the rendezvous store and of the --recovery step store; etcd (whose
  // cluster replicates the rendezvous): of the --recovery step store.
  if (o.conf.standby_stores_given && o.backend == Backend::kStatic) {
    throw UsageError(
        "--rdzv-conf standby_stores: only the c10d and etcd backends keep standby stores (a "
        "static round ends with node 0, which every static round needs anyway)");
  }
  if (o.endpoints.size() > 1 && !uses_etcd(o.backend)) {
    throw UsageError(fmt::format(
        "--rdzv-endpoint lists {} endpoints: only the etcd backends take a list (the members "
        "of the etcd cluster); {} takes one HOST:PORT",
        o.endpoints.size(), to_string(o.backend)));
  }
  if (o.hostname.find_first_of("\t\n") != std::string::npos ||
      o.local_addr.find_first_of("\t\n") != std::string::npos ||
      o.standby.find_first_of("\t\n ,") != std::string::npos) {
    throw UsageError("host name or --local-addr contains a tab or newline");
  }
}

}  // namespace ddp::rdzv
