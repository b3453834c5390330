#include "ddp/launcher/multi_node.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "ddp/cluster/detect.hpp"
#include "ddp/cluster/doctor.hpp"
#include "ddp/rendezvous/endpoint_store.hpp"
#include "ddp/rendezvous/etcd/etcd_doctor.hpp"
#include "ddp/rendezvous/options.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {

std::vector<std::string> apply_cluster_detection(LaunchOptions& o, const cluster::EnvMap& env,
                                                 const std::string& hostname) {
  cluster::DetectOptions d;
  d.hostname = hostname;
  if (o.given.nnodes) d.overrides.nnodes = o.nnodes;
  if (o.given.node_rank) d.overrides.node_rank = o.node_rank;
  if (o.given.master_addr) d.overrides.master_addr = o.master_addr;
  if (o.given.run_id) d.overrides.run_id = o.run_id;
  if (o.given.nproc_per_node) d.overrides.nproc_per_node = o.nproc_per_node;
  // An elastic range is the user's own choice of node counts: detection must not check a
  // node rank against it (c10d assigns node ranks).
  if (o.nnodes_min != o.nnodes) d.overrides.node_rank = 0;
  cluster::ClusterInfo info = cluster::detect_cluster(env, d);

  std::vector<std::string> lines;
  if (!info.detected()) {
    if (is_multi_node(o)) {
      lines.push_back(
          "multi-node settings from the command line (no SLURM, PBS or mpirun allocation "
          "detected)");
    }
    return lines;
  }
  if (!o.given.nnodes) o.nnodes = o.nnodes_min = info.nnodes;
  if (!o.given.node_rank) o.node_rank = info.node_rank;
  if (!o.given.master_addr && !info.master_addr.empty() && info.nnodes > 1) {
    o.master_addr = info.master_addr;
  }
  if (!o.given.master_port && info.master_port && info.nnodes > 1)
    o.master_port = *info.master_port;
  if (!o.given.run_id && !info.run_id.empty()) o.run_id = info.run_id;
  if (!o.given.nproc_per_node && info.nproc_per_node) o.nproc_per_node = *info.nproc_per_node;
  lines.push_back(info.explanation);
  for (const auto& w : info.warnings) lines.push_back("warning: " + w);
  if (is_multi_node(o) && info.nnodes > 1 && info.master_addr.empty() && !o.given.master_addr &&
      !o.rdzv_endpoint) {
    throw UsageError(fmt::format(
        "{}: the master host is unknown; pass --master-addr HOST (node 0's address) or "
        "--rdzv-endpoint HOST:PORT, or export MASTER_ADDR through mpirun (-x MASTER_ADDR)",
        info.explanation));
  }
  return lines;
}

namespace {

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || cluster::is_loopback_address(host);
}

// True when `host` is a loopback address or a name that resolves only to loopback addresses.
bool resolves_to_loopback(const std::string& host) {
  if (is_loopback_host(host)) return true;
  try {
    auto addrs = cluster::resolve_host(host, std::chrono::milliseconds(3000));
    return !addrs.empty() && std::all_of(addrs.begin(), addrs.end(), [](const std::string& a) {
      return cluster::is_loopback_address(a);
    });
  } catch (const Error&) {
    return false;
  }
}

std::string default_route_source() {
  try {
    // A documentation address (RFC 5737): only the routing table is consulted, nothing is sent.
    return cluster::route_to("198.51.100.1").local_address;
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

std::string publishable_address(const AddressFacts& f) {
  if (f.max_nodes <= 1 || !f.candidate_is_loopback || is_loopback_host(f.endpoint_host)) {
    return f.candidate;
  }
  std::vector<std::string> v4, all;
  for (const auto& itf : f.interfaces) {
    if (!itf.up || itf.loopback) continue;
    for (const auto& a : itf.addresses) {
      if (cluster::is_loopback_address(a) || a.rfind("fe80:", 0) == 0) continue;  // link-local
      (a.find(':') == std::string::npos ? v4 : all).push_back(a);
    }
  }
  all.insert(all.begin(), v4.begin(), v4.end());
  // No interface off this machine is up: no other node can reach this one whatever it
  // publishes, and reaching the endpoint will fail with the network's own diagnosis
  // ("cannot reach the rendezvous endpoint ... unreachable"), which names the real cause.
  if (all.empty()) return f.candidate;
  if (v4.size() == 1) return v4.front();
  if (v4.empty() && all.size() == 1) return all.front();
  if (!f.default_route_source.empty() &&
      std::find(all.begin(), all.end(), f.default_route_source) != all.end()) {
    return f.default_route_source;
  }
  throw UsageError(fmt::format(
      "this node would publish MASTER_ADDR {} (its route to the rendezvous endpoint {}), a "
      "loopback address, but the job may span {} nodes: the other nodes' workers would connect "
      "to themselves. A host name mapped to loopback in /etc/hosts (Debian's \"127.0.1.1 "
      "hostname\" line) does this. Pass --local-addr ADDRESS, this node's address as the other "
      "nodes reach it ({}), or use that address in --rdzv-endpoint / --master-addr",
      f.candidate, f.endpoint_host, f.max_nodes, fmt::format("one of {}", fmt::join(all, ", "))));
}

bool is_multi_node(const LaunchOptions& o) {
  return o.nnodes > 1 || o.rdzv_endpoint.has_value() || o.rdzv_backend != "static";
}

RendezvousMembershipOptions rendezvous_settings(const LaunchOptions& o,
                                                const std::string& hostname) {
  RendezvousMembershipOptions m;
  rdzv::RendezvousOptions& r = m.rdzv;
  r.backend = rdzv::parse_backend(o.rdzv_backend);
  r.conf = rdzv::parse_rdzv_conf(o.rdzv_conf);
  r.run_id = o.run_id;
  rdzv::validate_run_id(r.run_id);
  r.nodes = {o.nnodes_min, o.nnodes};
  r.node_rank = o.node_rank;
  r.local_world_size = o.nproc_per_node;
  r.hostname = hostname;
  r.take_lost_slots = o.recovery_step;

  if (o.rdzv_endpoint) {
    r.endpoints = rdzv::parse_endpoints(*o.rdzv_endpoint, rdzv::uses_etcd(r.backend)
                                                              ? rdzv::kDefaultEtcdPort
                                                              : rdzv::kDefaultRendezvousPort);
    r.endpoint = r.endpoints.front();
  } else if (rdzv::uses_etcd(r.backend)) {
    throw UsageError(fmt::format(
        "--rdzv-backend {} needs --rdzv-endpoint HOST[:PORT][,HOST[:PORT]...]: the client URLs "
        "of the etcd cluster (port 2379 by default), the same on every node",
        o.rdzv_backend));
  } else if (r.backend == rdzv::Backend::kStatic) {
    if (o.master_port >= 65535) {
      throw UsageError(fmt::format(
          "--master-port {}: the static rendezvous uses MASTER_PORT + 1 for the agents' store; "
          "pick a lower port or pass --rdzv-endpoint HOST:PORT",
          o.master_port));
    }
    r.endpoint = {o.master_addr, static_cast<uint16_t>(o.master_port + 1)};
  } else {
    throw UsageError(
        "--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]: the address of one of the nodes "
        "(its agent serves the rendezvous store), the same on every node");
  }
  if (r.backend == rdzv::Backend::kStatic) {
    m.serve_store = o.node_rank == 0;
    if (o.given.master_port) {
      int port = o.master_port;
      r.pick_master_port = [port] { return port; };
    }
  } else if (!rdzv::uses_etcd(r.backend)) {
    m.serve_store = rdzv::is_local_host(r.endpoint.host);
  }
  // torchrun's etcd backend calls its join timeout "timeout".
  if (rdzv::uses_etcd(r.backend) && r.conf.timeout && !r.conf.join_timeout_given) {
    r.conf.join_timeout = *r.conf.timeout;
  }
  // Static: the workers meet at the user's --master-addr (the endpoint every agent reached),
  // as with torchrun; the address node 0 finds for itself may be loopback.
  if (r.backend == rdzv::Backend::kStatic && (o.given.master_addr || !o.rdzv_endpoint)) {
    m.master_addr = o.master_addr;
  }
  if (o.local_addr) {
    r.local_addr = *o.local_addr;  // the user's word
  } else {
    r.local_addr = rdzv::local_address_towards(r.endpoint.host);
    if (!m.master_addr && r.nodes.max > 1) {
      AddressFacts facts;
      facts.endpoint_host = r.endpoint.host;
      facts.candidate = r.local_addr;
      facts.candidate_is_loopback = resolves_to_loopback(r.local_addr);
      facts.max_nodes = r.nodes.max;
      if (facts.candidate_is_loopback && !is_loopback_host(facts.endpoint_host)) {
        facts.interfaces = cluster::list_interfaces();
        facts.default_route_source = default_route_source();
      }
      r.local_addr = publishable_address(facts);
    }
  }
  if (r.conf.token_file) m.token = rdzv::read_token_file(*r.conf.token_file);
  rdzv::validate(r);
  return m;
}

int run_doctor_command(const DoctorCommand& command) {
  cluster::DoctorOptions d;
  d.timeout = std::chrono::milliseconds(static_cast<int64_t>(command.timeout_s * 1000));
  const rdzv::Backend backend =
      command.backend ? rdzv::parse_backend(*command.backend) : rdzv::Backend::kC10d;
  const rdzv::RendezvousConf conf =
      command.rdzv_conf ? rdzv::parse_rdzv_conf(*command.rdzv_conf) : rdzv::RendezvousConf();
  std::optional<rdzv::EtcdStoreOptions> etcd;
  if (rdzv::uses_etcd(backend)) {
    // The etcd members are checked below; the ddp store checks (store-auth, clock-skew) would
    // only say an etcd is not a ddp store.
    if (!command.endpoint) {
      throw UsageError(
          "ddprun doctor --rdzv-backend etcd: give the etcd members to check with "
          "--rdzv-endpoint HOST:PORT[,HOST:PORT...]");
    }
    rdzv::RendezvousOptions r;
    r.backend = backend;
    r.endpoints = rdzv::parse_endpoints(*command.endpoint, rdzv::kDefaultEtcdPort);
    r.endpoint = r.endpoints.front();
    r.conf = conf;
    rdzv::validate(r);
    etcd = rdzv::etcd_store_options(r);
    etcd->connect_timeout = d.timeout;
    etcd->read_timeout = d.timeout;
  } else {
    if (!conf.etcd_keys.empty()) {
      throw UsageError(fmt::format(
          "ddprun doctor --rdzv-conf {}: an etcd key; pass --rdzv-backend etcd to check an etcd",
          conf.etcd_keys.front()));
    }
    d.endpoint = command.endpoint;
    const auto token_file = command.token_file ? command.token_file : conf.token_file;
    if (token_file) d.token = rdzv::read_token_file(*token_file);
  }
  auto results = cluster::run_doctor(d);
  if (etcd) {
    for (auto& r : rdzv::check_etcd(*etcd)) results.push_back(std::move(r));
  }
  cluster::print_doctor_report(std::cout, results);
  std::cout.flush();
  return cluster::doctor_exit_code(results);
}

}  // namespace ddp::launcher
