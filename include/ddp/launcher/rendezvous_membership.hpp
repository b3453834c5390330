#pragma once
// Membership (membership.hpp) backed by the rendezvous protocol (ddp/rendezvous/): the agent on
// the endpoint host serves the store, every agent joins rounds, a MembershipWatcher thread
// heartbeats and wakes the agent when the round must end.
//
// Nothing touches the network until the first next_round(), which the agent calls after it
// has blocked its signals: threads started from then on (the store server, the watcher)
// inherit the blocked mask, so SIGTERM and SIGCHLD keep arriving on the agent's signalfd.

#include <memory>
#include <optional>
#include <string>

#include "ddp/launcher/join_progress.hpp"
#include "ddp/launcher/membership.hpp"
#include "ddp/rendezvous/options.hpp"

namespace ddp::launcher {

struct RendezvousMembershipOptions {
  rdzv::RendezvousOptions rdzv;
  // Serve the store on the endpoint port (this is the endpoint host, or static node 0). When
  // binding fails because another agent on this machine already serves it, join as a client
  // (several agents of one job may share a machine, as torchrun allows).
  bool serve_store = false;
  // Store token; nullopt: $DDP_STORE_TOKEN.
  std::optional<std::string> token;
  int notice_fd = 2;
  // The workers' MASTER_ADDR instead of the one the round publishes (the address of the node
  // that formed it). Static backend: the user's --master-addr, as torchrun uses it.
  std::optional<std::string> master_addr;
  // How long the store host waits for peers to finish before closing the store.
  rdzv::Millis exit_barrier{300000};
  // While a round forms, a progress line every this long on notice_fd (join_progress.hpp).
  rdzv::Millis progress_interval = kDefaultJoinProgressInterval;
};

std::unique_ptr<Membership> make_rendezvous_membership(RendezvousMembershipOptions options);

}  // namespace ddp::launcher
