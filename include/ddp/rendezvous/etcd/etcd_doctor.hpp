#pragma once
// `ddprun doctor --rdzv-backend etcd --rdzv-endpoint HOST:PORT,...`: what an etcd cluster looks
// like from this node before a job relies on it, as doctor checks (cluster/doctor.hpp):
//   etcd HOST:PORT  one per listed member: its version, member id, the leader it knows, raft
//                   term, database size and answer time; FAIL with the client's classified
//                   error (refused, unreachable, TLS, not etcd) and its fix; warn on alarms
//                   (NOSPACE: etcd refuses every write)
//   etcd-cluster    the members that answered belong to one cluster that has a leader (FAIL:
//                   different clusters, no leader); warn when some listed member did not answer
//   etcd-write      a probe key under the prefix written, read back and deleted, timed: every
//                   rendezvous write waits for a raft commit on etcd's disk (warn when slow;
//                   FAIL when etcd refuses the write, e.g. authentication without permission)
// Every request is bounded by options.read_timeout, every connection by connect_timeout.

#include <vector>

#include "ddp/cluster/doctor.hpp"
#include "ddp/rendezvous/etcd/etcd_store.hpp"

namespace ddp::rdzv {

// A put slower than this gets a warning: a round of N nodes makes a few writes per node.
constexpr Millis kSlowEtcdWrite{200};

std::vector<cluster::CheckResult> check_etcd(const EtcdStoreOptions& options);

}  // namespace ddp::rdzv
