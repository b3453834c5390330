#pragma once
// From ddprun's options to a multi-node run: cluster auto-detection (SLURM, PBS, mpirun fill
// what the flags leave out), the rendezvous settings, and `ddprun doctor`.

#include <string>
#include <vector>

#include "ddp/cluster/environment.hpp"
#include "ddp/cluster/netinfo.hpp"
#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/launch_options.hpp"
#include "ddp/launcher/rendezvous_membership.hpp"

namespace ddp::launcher {

// Inside a SLURM/PBS/mpirun allocation: sets nnodes, node rank, master address, run id and
// processes per node from the scheduler for every one the user did not give (explicit flags
// win). Returns the lines to log (which source was used), empty when nothing was detected
// and the run is single-node. UsageError on inconsistent scheduler variables.
std::vector<std::string> apply_cluster_detection(LaunchOptions& options, const cluster::EnvMap& env,
                                                 const std::string& hostname = "");

// Whether the run needs a rendezvous: more than one node, an endpoint, or the c10d backend.
bool is_multi_node(const LaunchOptions& options);

// The rendezvous settings for this node. Resolves the endpoint (static without
// --rdzv-endpoint: MASTER_ADDR and MASTER_PORT + 1, leaving MASTER_PORT to the workers),
// whether this agent serves the store, this node's address and the token. UsageError on
// missing or inconsistent flags.
RendezvousMembershipOptions rendezvous_settings(const LaunchOptions& options,
                                                const std::string& hostname);

// What a node knows about its addresses when it must pick the one to publish as MASTER_ADDR.
struct AddressFacts {
  std::string endpoint_host;           // the rendezvous endpoint's host as the user wrote it
  std::string candidate;               // the route source towards it (or this host's name)
  bool candidate_is_loopback = false;  // it is, or resolves only to, a loopback address
  int max_nodes = 1;
  std::vector<cluster::NetInterface> interfaces;
  std::string default_route_source;  // source address of the default route; "" if none
};

// The address this node publishes for the others (MASTER_ADDR when it forms the round). The
// candidate, unless the job may span several nodes, the candidate is loopback (the route to
// this node's own name, or Debian's "127.0.1.1 hostname" line in /etc/hosts) and the endpoint
// is not itself a loopback address (then every node is on this machine): then this node's one
// non-loopback IPv4 address (or only address), else the default route's source among them.
// UsageError naming the candidates and --local-addr when there is no single choice.
std::string publishable_address(const AddressFacts& facts);

// `ddprun doctor`: prints the report to stdout, returns the exit code (0 ok, 1 a check failed).
int run_doctor_command(const DoctorCommand& command);

}  // namespace ddp::launcher
