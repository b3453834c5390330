#pragma once
// What the failures of requests to etcd mean, beyond classify() (etcd_http.hpp): the reasons
// EtcdHttp's retry loop recognises in a retried failure, and the error a call ends with when
// its retries ran out. Internal to src/rendezvous/etcd.

#include <chrono>
#include <string>
#include <vector>

#include "etcd_http.hpp"

namespace ddp::rdzv::etcd {

// The start of the reason of an idempotent request that a member accepted and left unanswered.
inline const std::string kNoAnswer = "accepted the request, no answer";
// etcd's back-pressure: its apply loop is more than 5,000 raft entries behind the commits, and
// it refuses new proposals before proposing them, so the request was not applied (any request,
// a write included, may be sent again).
inline const std::string kOverloaded = "overloaded";

// etcd answered, but did not commit the request within its own request timeout (7 s by
// default): "etcdserver: request timed out" (and its variants: "possibly due to previous leader
// failure", "waiting for the applied index took too long"), or etcd 3.4's bare "context deadline
// exceeded". The member is alive and serves its client port; raft is too slow (overload: slow
// disks, starved CPU) or has no quorum.
bool etcd_timed_out(const std::string& reason);

// etcd answered that its leader changed while it handled the request: the cluster has a quorum
// and elects leaders, but elections keep interrupting it (members starved of CPU or disk miss
// their heartbeats: etcd's log says "server is likely overloaded", long wal syncs). Measured
// with 10,000 simulated agents on 3 members sharing 2 cores: 65 s of "leader changed" from
// every member.
bool leader_churn(const std::string& reason);

// Throws the error of `request` after its retries over the members ran out: `last` holds each
// member's last failure reason ("" not tried), `first_failure` when the retries began,
// `per_attempt` the bound of one attempt. The error names the likely cause (an overloaded or
// leaderless cluster, a gateway cut off from etcd, TLS against plain HTTP, an unreachable
// endpoint) and its fix.
[[noreturn]] void give_up(const HttpOptions& options, const std::string& request,
                          const std::vector<std::string>& last,
                          std::chrono::steady_clock::time_point first_failure, Millis per_attempt);

}  // namespace ddp::rdzv::etcd
