#include "ddp/launcher/multi_node.hpp"

#include <fmt/format.h>

#include <iostream>

#include "ddp/cluster/detect.hpp"
#include "ddp/cluster/doctor.hpp"
#include "ddp/rendezvous/endpoint_store.hpp"
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

bool is_multi_node(const LaunchOptions& o) {
  return o.nnodes > 1 || o.rdzv_endpoint.has_value() || o.rdzv_backend == "c10d";
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

  if (o.rdzv_endpoint) {
    r.endpoint = rdzv::parse_endpoint(*o.rdzv_endpoint, rdzv::kDefaultRendezvousPort);
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
  } else {
    m.serve_store = rdzv::is_local_host(r.endpoint.host);
  }
  r.local_addr = o.local_addr ? *o.local_addr : rdzv::local_address_towards(r.endpoint.host);
  if (r.conf.token_file) m.token = rdzv::read_token_file(*r.conf.token_file);
  rdzv::validate(r);
  return m;
}

int run_doctor_command(const DoctorCommand& command) {
  cluster::DoctorOptions d;
  d.endpoint = command.endpoint;
  d.timeout = std::chrono::milliseconds(static_cast<int64_t>(command.timeout_s * 1000));
  if (command.token_file) d.token = rdzv::read_token_file(*command.token_file);
  auto results = cluster::run_doctor(d);
  cluster::print_doctor_report(std::cout, results);
  std::cout.flush();
  return cluster::doctor_exit_code(results);
}

}  // namespace ddp::launcher
