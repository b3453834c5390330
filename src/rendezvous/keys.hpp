#pragma once
// The store key layout of the rendezvous (docs/rendezvous.md). Internal to src/rendezvous.
//
//   rdzv/_runs/#count                  agents registered at this endpoint (any run id)
//   rdzv/_runs/#<i>                    "<run_id>\t<host>" of the i-th registration
//   rdzv/_runs/<run_id>                set once: the host of run_id's first agent, which
//                                      added the run's registry entry
//   rdzv/<run_id>/gen                  the current generation (decimal)
//   rdzv/<run_id>/shutdown             set once: why the run was shut down
//   rdzv/<run_id>/<g>/slot             join counter of round g
//   rdzv/<run_id>/<g>/node/<i>         info of the node in slot i
//   rdzv/<run_id>/<g>/hb/<i>           heartbeat counter of slot i, or "done" / "left" /
//                                      "lost"
//   rdzv/<run_id>/<g>/closed           number of members, set once with compare_set
//   rdzv/<run_id>/<g>/pending          nodes waiting for a later round
//   rdzv/<run_id>/<g>/changed          set once: why round g ended
//   rdzv/<run_id>/<g>/world            "num_nodes world_size master_port master_addr"
//   rdzv/<run_id>/<g>/rank/<i>         first global rank of slot i
//   rdzv/<run_id>/<g>/lost             nodes lost while round g ran (--recovery step), a counter
//   rdzv/<run_id>/<g>/back             lost slots another node took back, a counter (etcd's
//                                      add() only counts up)
//   rdzv/<run_id>/<g>/took/<i>         set once: info of the node that took lost slot i's place
//   rdzv/<run_id>/<g>/standbys         "HOST:PORT,..." the standby stores of round g, in
//                                      order of preference ("-": none)
//   rdzv/<run_id>/<g>/extent           1 + the highest slot a member of round g holds: the
//                                      round's size when it formed, raised by nodes that grew
//                                      it while it ran (--recovery step, round_growth.hpp)
//   rdzv/<run_id>/<g>/grown            nodes that grew round g (slots past its size), a counter
//   rdzv/<run_id>/<g>/withdrawn        of those, the ones that found the round full, a counter
//   rdzv/<run_id>/<g>/grown_ranks      workers the nodes that grew round g brought, a counter:
//                                      their global ranks follow the round's world size

#include <cstdint>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "ddp/util/error.hpp"

namespace ddp::rdzv::keys {

// The integer a rendezvous key holds (a generation, a count, a rank); ProtocolError naming the
// key otherwise.
inline int64_t int_value(const std::string& value, const std::string& key) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0') {
    throw ProtocolError(
        fmt::format("rendezvous key {} holds '{}', expected an integer", key, value));
  }
  return v;
}

inline const std::string kRunsCount = "rdzv/_runs/#count";
inline std::string run_entry(int64_t i) {
  return fmt::format("rdzv/_runs/#{}", i);
}
inline std::string run_registered(const std::string& run_id) {
  return "rdzv/_runs/" + run_id;
}

inline std::string generation(const std::string& run_id) {
  return "rdzv/" + run_id + "/gen";
}
inline std::string shutdown(const std::string& run_id) {
  return "rdzv/" + run_id + "/shutdown";
}

constexpr const char* kDone = "done";
constexpr const char* kLeft = "left";
// Set by a survivor whose --recovery step agent took the node's loss: the round goes on
// without it (membership_watcher.hpp); as "done" for everyone waiting on heartbeats.
constexpr const char* kLost = "lost";
// A heartbeat kept alive by its writer's lease instead of a counter (a KeptAliveKeys store:
// etcd): live while present, gone once the store deleted it (heartbeats.hpp).
constexpr const char* kAlive = "alive";

struct Round {
  Round(const std::string& run_id, int64_t g) : base(fmt::format("rdzv/{}/{}/", run_id, g)) {}
  std::string base;
  std::string slot() const { return base + "slot"; }
  std::string node(int i) const { return base + fmt::format("node/{}", i); }
  std::string hb(int i) const { return base + fmt::format("hb/{}", i); }
  std::string closed() const { return base + "closed"; }
  std::string pending() const { return base + "pending"; }
  std::string changed() const { return base + "changed"; }
  std::string world() const { return base + "world"; }
  std::string rank(int i) const { return base + fmt::format("rank/{}", i); }
  std::string standbys() const { return base + "standbys"; }
  std::string lost() const { return base + "lost"; }
  std::string back() const { return base + "back"; }
  std::string took(int i) const { return base + fmt::format("took/{}", i); }
  std::string extent() const { return base + "extent"; }
  std::string grown() const { return base + "grown"; }
  std::string withdrawn() const { return base + "withdrawn"; }
  std::string grown_ranks() const { return base + "grown_ranks"; }
};

}  // namespace ddp::rdzv::keys
