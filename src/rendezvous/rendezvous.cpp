#include "ddp/rendezvous/rendezvous.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "ddp/util/socket.hpp"
#include "heartbeats.hpp"
#include "keys.hpp"
#include "node_info.hpp"
#include "round_growth.hpp"
#include "store_wait.hpp"

namespace ddp::rdzv {

namespace {

using Clock = std::chrono::steady_clock;

int default_master_port() {
  // Binding every interface (as the workers' TCPStore will) makes "free" mean free for it.
  net::Socket s = net::listen_tcp("", 0, 1);
  return net::local_port(s.fd());
}

}  // namespace

Rendezvous::Rendezvous(RendezvousOptions options, std::shared_ptr<Store> store)
    : options_(std::move(options)), store_(std::move(store)) {
  if (!store_) throw UsageError("Rendezvous: no store given");
  validate(options_);
  set_standby(options_.standby);
}

void Rendezvous::set_standby(const std::string& standby) {
  options_.standby = standby;
  info_ = encode_node_info(options_.hostname, options_.local_addr, options_.local_world_size,
                           static_cast<long>(::getpid()), standby);
}

void Rendezvous::move_to_store(std::shared_ptr<Store> store) {
  if (!store) throw UsageError("Rendezvous::move_to_store: no store given");
  store_ = std::move(store);
  registered_ = false;
  in_round_ = false;
  if (!last_generation_) return;
  // A new store may start empty: the first member to arrive records the lost round as the
  // current one (the others find it there), and advance_generation() moves every member past
  // it as it would on the old store. A promoted standby has it already.
  store_->compare_set(keys::generation(options_.run_id), "", std::to_string(*last_generation_));
}

void Rendezvous::follow_store(std::shared_ptr<Store> store) {
  if (!store) throw UsageError("Rendezvous::follow_store: no store given");
  store_ = std::move(store);
}

void Rendezvous::register_run() {
  if (registered_) return;
  // Run-id independent registry, so an agent that times out can name the run ids other
  // agents at this endpoint used: one entry per run id, by the first of its agents (the entry
  // names that agent's host). Not one per agent: each agent raising the registry's counter cost
  // 10,000 agents on etcd O(N^2) work (an etcd add() counts its counter's tickets: etcd spent
  // minutes on those counts and never formed the round).
  if (store_->compare_set(keys::run_registered(options_.run_id), "", options_.hostname) ==
      options_.hostname) {
    int64_t i = store_->add(keys::kRunsCount, 1) - 1;
    store_->multi_set({keys::run_entry(i)}, {options_.run_id + "\t" + options_.hostname});
  }
  registered_ = true;
}

std::optional<std::string> Rendezvous::shutdown_reason() {
  std::string key = keys::shutdown(options_.run_id);
  if (!store_->check({key})) return std::nullopt;
  return store_->get(key);
}

void Rendezvous::throw_if_shut_down() {
  if (auto reason = shutdown_reason()) {
    throw RendezvousClosedError(
        fmt::format("run '{}' was shut down by one of its agents: {}", options_.run_id, *reason));
  }
}

int64_t Rendezvous::advance_generation() {
  std::string gen_key = keys::generation(options_.run_id);
  if (!last_generation_) return keys::int_value(store_->compare_set(gen_key, "", "0"), gen_key);
  int64_t g = *last_generation_;
  // Invariant: the generation moves past g only once round g is marked as ended, so every
  // member of g is woken before anyone can join g + 1.
  keys::Round k(options_.run_id, g);
  store_->compare_set(k.changed(), "",
                      fmt::format("node {} started a new round", options_.hostname));
  return keys::int_value(store_->compare_set(gen_key, std::to_string(g), std::to_string(g + 1)),
                         gen_key);
}

void Rendezvous::throw_if_lost_in_place() {
  keys::Round k(options_.run_id, round_.generation);
  if (!store_->check({k.hb(slot_)})) return;  // the round's keys expired (etcd's key_ttl)
  const std::string beat = store_->get(k.hb(slot_));
  std::string taker;
  if (store_->check({k.took(slot_)})) taker = store_->get(k.took(slot_));
  if (beat != keys::kLost && (taker.empty() || taker == info_)) return;
  std::string by;
  if (!taker.empty() && taker != info_) {
    const JoinedNode node = decode_node_info(taker, slot_, k.took(slot_));
    by = fmt::format(", and node {} ({}) took its place", node.host, node.addr);
  }
  throw Error(fmt::format(
      "this node (node rank {} of round {}) was declared lost while the round ran (it missed its "
      "heartbeats: a network split, or a stalled agent) and the job went on without it{}; it "
      "does not join again, which would end the others' round: start a new agent to add a node "
      "(it takes a lost node's place, or waits for the next round)",
      slot_, round_.generation, by));
}

RoundInfo Rendezvous::next_round() {
  auto deadline = deadline_after(options_.conf.join_timeout);
  // --recovery step: a node the round went on without must not end it by starting the next.
  if (in_round_ && slot_ >= 0) throw_if_lost_in_place();
  in_round_ = false;
  slot_ = -1;
  register_run();
  for (;;) {
    throw_if_shut_down();
    int64_t g = advance_generation();
    if (auto r = try_round(g, deadline)) {
      round_ = std::move(*r);
      in_round_ = true;
      return round_;
    }
  }
}

std::optional<RoundInfo> Rendezvous::try_round(int64_t g, Clock::time_point deadline) {
  keys::Round k(options_.run_id, g);
  auto start = Clock::now();
  const int min = options_.nodes.min, max = options_.nodes.max;
  last_generation_ = g;

  if (options_.backend == Backend::kStatic) {
    int slot = options_.node_rank;
    std::string holder = store_->compare_set(k.node(slot), "", info_);
    if (holder != info_) {
      JoinedNode other = decode_node_info(holder, slot, k.node(slot));
      throw UsageError(fmt::format(
          "--node-rank {} is claimed by two nodes: {} ({}) and this one ({}); give each node a "
          "distinct --node-rank in 0..{}",
          slot, other.host, other.addr, options_.hostname, max - 1));
    }
    store_->set(k.hb(slot), "0");
    slot_ = slot;
    auto r = slot == 0 ? assemble(g, max, deadline) : read_assignment(g, slot, max, deadline);
    if (!r) throw_timeout(g, slot == 0 ? "nodes to join" : "node 0 to publish the ranks", start);
    return r;
  }

  int slot = static_cast<int>(store_->add(k.slot(), 1) - 1);
  store_->multi_set({k.node(slot), k.hb(slot)}, {info_, "0"});
  if (slot + 1 >= max) store_->compare_set(k.closed(), "", std::to_string(max));
  if (slot + 1 >= min) {
    // Last call: the round stays open this long for more nodes (up to MAX), then whoever of
    // the joiners past MIN wakes first closes it with the count of slots taken so far.
    Millis last_call = std::min(options_.conf.last_call_timeout, remaining(deadline));
    if (!wait_for_keys(*store_, {k.closed()}, last_call)) {
      int64_t count = store_->add(k.slot(), 0);
      store_->compare_set(k.closed(), "", std::to_string(std::min<int64_t>(count, max)));
    }
  } else if (!wait_for_keys(*store_, {k.closed()}, remaining(deadline))) {
    throw_timeout(g, "nodes to join", start);
  }
  int n = static_cast<int>(keys::int_value(store_->get(k.closed()), k.closed()));

  // --recovery step: a node too late for a running round joins it in place, once node 0 has
  // published its assignment (a round abandoned before that is joined at the next one).
  if (slot >= n && options_.take_lost_slots &&
      wait_for_keys(*store_, {k.world()},
                    std::min<Millis>(options_.conf.close_timeout, remaining(deadline)))) {
    if (auto r = take_lost_slot(g, n, deadline)) return r;
    if (auto r = grow_round(g, n, slot, deadline)) return r;
  }
  if (slot >= n) {
    // Too late for round g: count ourselves in, so its members start a new round (if it is
    // below MAX), and wait for that.
    store_->add(k.pending(), 1);
    log::get("ddp.rdzv")
        ->info(
            "round {} of run '{}' is already running with {} of at most {} nodes; waiting "
            "to be admitted at the next round",
            g, options_.run_id, n, max);
    wait_for_admission(g, n, deadline, start);
    return std::nullopt;
  }

  slot_ = slot;
  auto close_deadline = deadline_after(options_.conf.close_timeout);
  auto r = slot == 0 ? assemble(g, n, close_deadline) : read_assignment(g, slot, n, close_deadline);
  if (!r) {
    // A member vanished between taking its slot and publishing (or node 0 did): abandon the
    // round; everyone moves to the next one.
    request_new_round(fmt::format("round {} did not complete within close_timeout ({} ms)", g,
                                  options_.conf.close_timeout.count()));
    return std::nullopt;
  }
  return r;
}

std::optional<RoundInfo> Rendezvous::take_lost_slot(int64_t g, int n, Clock::time_point deadline) {
  keys::Round k(options_.run_id, g);
  const std::vector<int> members = round_members(*store_, k, n);
  std::vector<std::string> hb_keys;
  for (int i : members) hb_keys.push_back(k.hb(i));
  const std::vector<std::optional<std::string>> beats = read_heartbeats(*store_, hb_keys);
  for (size_t m = 0; m < members.size(); ++m) {
    const int i = members[m];
    if (beats[m] != keys::kLost) continue;
    const JoinedNode lost = decode_node_info(store_->get(k.node(i)), i, k.node(i));
    if (lost.local_world_size != options_.local_world_size) continue;
    if (store_->compare_set(k.took(i), "", info_) != info_) continue;  // another node's
    // The watchers read took/<i> when slot i's heartbeat moves again: it goes first.
    store_->set(k.node(i), info_);
    store_->add(k.back(), 1);
    store_->set(k.hb(i), "0");
    slot_ = i;
    std::optional<RoundInfo> r = read_assignment(g, i, n, deadline);
    if (!r) throw_timeout(g, "the round's assignment (taking a lost node's place)", Clock::now());
    r->took_lost_slot = true;
    r->num_nodes = std::max(r->num_nodes, read_extent(*store_, k, n));
    log::get("ddp.rdzv")
        ->info(
            "round {} of run '{}' runs with {} nodes; this node takes the place of node {} "
            "({}), lost while it ran (--recovery step)",
            g, options_.run_id, n, i, lost.host);
    return r;
  }
  return std::nullopt;
}

std::optional<RoundInfo> Rendezvous::grow_round(int64_t g, int n, int slot,
                                                Clock::time_point deadline) {
  keys::Round k(options_.run_id, g);
  const int max = options_.nodes.max;
  if (live_nodes(*store_, k, n) >= max) return std::nullopt;
  store_->add(k.grown(), 1);
  if (live_nodes(*store_, k, n) > max) {
    // Another node grew it at the same moment and took the last place.
    store_->add(k.withdrawn(), 1);
    return std::nullopt;
  }
  // This join slot's node/<slot> and hb/<slot> hold this node's info and first heartbeat
  // (try_round wrote them); rank/<slot> makes it a member, then the extent shows it.
  const int64_t ranks_end = store_->add(k.grown_ranks(), options_.local_world_size);
  std::optional<RoundInfo> r = read_assignment(g, 0, n, deadline);
  if (!r) throw_timeout(g, "the round's assignment (growing it)", Clock::now());
  const int launch_world = r->world_size;
  r->node_rank = slot;
  r->rank_offset = launch_world + static_cast<int>(ranks_end) - options_.local_world_size;
  r->world_size = launch_world + static_cast<int>(ranks_end);
  store_->set(k.rank(slot), std::to_string(r->rank_offset));
  raise_extent(*store_, k, slot + 1);
  r->num_nodes = std::max(slot + 1, read_extent(*store_, k, n));
  r->grew_round = true;
  slot_ = slot;
  log::get("ddp.rdzv")
      ->info(
          "round {} of run '{}' runs with {} of at most {} nodes; this node grows it in slot {} "
          "(ranks {}-{}, --recovery step)",
          g, options_.run_id, n, max, slot, r->rank_offset, r->world_size - 1);
  return r;
}

void Rendezvous::wait_for_admission(int64_t g, int n, Clock::time_point deadline,
                                    Clock::time_point start) {
  keys::Round k(options_.run_id, g);
  std::vector<std::string> hb_keys;
  for (int i : round_members(*store_, k, n)) hb_keys.push_back(k.hb(i));
  // A member is gone when it finished or left, or when its heartbeat stood still for longer
  // than a live member's ever does: kMissedHeartbeats periods, or close_timeout (a member
  // heartbeats only once its workers run). A round whose members are all gone never ends by
  // itself: it is an earlier job's (etcd keeps a run's keys for key_ttl after its last agent),
  // or its agents all died. Then this node ends it and the next round starts.
  const auto still = std::max<Clock::duration>(options_.conf.heartbeat * kMissedHeartbeats,
                                               options_.conf.close_timeout);
  const Millis slice = std::min<Millis>(options_.conf.heartbeat * kMissedHeartbeats, Millis(5000));
  HeartbeatTracker members(*store_, hb_keys, still);
  for (;;) {
    if (!store_->check({k.closed()})) return;  // the round's keys expired: start afresh
    const std::vector<bool> gone = members.poll();
    if (std::all_of(gone.begin(), gone.end(), [](bool g) { return g; })) {
      request_new_round(
          fmt::format("round {} has no live member left (every node finished, left or went "
                      "silent); node {} starts the next",
                      g, options_.hostname));
      return;
    }
    if (wait_for_keys(*store_, {k.changed()}, std::min(slice, remaining(deadline)))) return;
    if (Clock::now() >= deadline) {
      throw_timeout(g,
                    fmt::format("admission (round {} runs with {} of at most {} nodes)", g, n,
                                options_.nodes.max),
                    start);
    }
  }
}

std::optional<RoundInfo> Rendezvous::assemble(int64_t g, int n, Clock::time_point info_deadline) {
  keys::Round k(options_.run_id, g);
  std::vector<std::string> node_keys;
  node_keys.reserve(n);
  for (int i = 0; i < n; ++i) node_keys.push_back(k.node(i));
  if (!wait_for_keys(*store_, node_keys, remaining(info_deadline))) return std::nullopt;
  std::vector<std::string> values = store_->multi_get(node_keys);

  RoundInfo r;
  r.generation = g;
  r.node_rank = 0;
  r.num_nodes = n;
  r.local_world_size = options_.local_world_size;
  std::vector<std::string> out_keys, out_values;
  out_keys.reserve(n + 1);
  out_values.reserve(n + 1);
  int offset = 0;
  for (int i = 0; i < n; ++i) {
    r.nodes.push_back(decode_node_info(values[i], i, node_keys[i]));
    out_keys.push_back(k.rank(i));
    out_values.push_back(std::to_string(offset));
    offset += r.nodes.back().local_world_size;
  }
  r.world_size = offset;
  r.formed_nodes = n;
  r.launch_world_size = offset;
  r.rank_offset = 0;
  r.master_addr = options_.local_addr;
  r.master_port = options_.pick_master_port ? options_.pick_master_port() : default_master_port();
  out_keys.push_back(k.world());
  out_values.push_back(fmt::format("{} {} {} {}", n, r.world_size, r.master_port, r.master_addr));
  std::string standbys;
  for (const JoinedNode& node : r.nodes) {
    if (node.standby.empty() ||
        static_cast<int>(r.standbys.size()) >= options_.conf.standby_stores) {
      continue;
    }
    r.standbys.push_back(node.standby);
    standbys += (standbys.empty() ? "" : ",") + node.standby;
  }
  out_keys.push_back(k.standbys());
  out_values.push_back(standbys.empty() ? "-" : standbys);
  out_keys.push_back(k.extent());
  out_values.push_back(std::to_string(n));
  store_->multi_set(out_keys, out_values);
  return r;
}

std::optional<RoundInfo> Rendezvous::read_assignment(int64_t g, int slot, int n,
                                                     Clock::time_point deadline) {
  keys::Round k(options_.run_id, g);
  std::vector<std::string> want = {k.world(), k.rank(slot), k.standbys()};
  if (!wait_for_keys(*store_, want, remaining(deadline))) return std::nullopt;
  std::vector<std::string> v = store_->multi_get(want);
  RoundInfo r;
  r.generation = g;
  r.node_rank = slot;
  r.local_world_size = options_.local_world_size;
  char addr[256] = {};
  long long nodes = 0, world = 0, port = 0;
  if (std::sscanf(v[0].c_str(), "%lld %lld %lld %255s", &nodes, &world, &port, addr) != 4 ||
      nodes != n) {
    throw ProtocolError(
        fmt::format("rendezvous key {} holds '{}', expected 'nodes world port addr' with {} nodes",
                    k.world(), v[0], n));
  }
  r.num_nodes = static_cast<int>(nodes);
  r.world_size = static_cast<int>(world);
  r.formed_nodes = r.num_nodes;
  r.launch_world_size = r.world_size;
  r.master_port = static_cast<int>(port);
  r.master_addr = addr;
  r.rank_offset = static_cast<int>(keys::int_value(v[1], k.rank(slot)));
  if (v[2] != "-") {
    std::stringstream list(v[2]);
    for (std::string standby; std::getline(list, standby, ',');) r.standbys.push_back(standby);
  }
  return r;
}

std::string Rendezvous::request_new_round(const std::string& reason) {
  if (!last_generation_) return "";
  return store_->compare_set(keys::Round(options_.run_id, *last_generation_).changed(), "", reason);
}

void Rendezvous::mark_finished() {
  if (!in_round_) return;
  store_->set(keys::Round(options_.run_id, round_.generation).hb(slot_), keys::kDone);
}

void Rendezvous::mark_left(const std::string& reason) {
  if (in_round_) {
    store_->set(keys::Round(options_.run_id, round_.generation).hb(slot_), keys::kLeft);
  }
  request_new_round(reason);
}

void Rendezvous::shutdown(const std::string& reason) {
  store_->compare_set(keys::shutdown(options_.run_id), "", reason);
  request_new_round("run shut down: " + reason);
}

bool Rendezvous::wait_for_peers_to_finish(Millis limit) {
  if (!in_round_) return true;
  keys::Round k(options_.run_id, round_.generation);
  std::vector<std::string> hb_keys;
  // Nodes that grew the round while it ran are its members too.
  for (int i : round_members(*store_, k, round_.formed_nodes)) {
    if (i != slot_) hb_keys.push_back(k.hb(i));
  }
  if (hb_keys.empty()) return true;
  HeartbeatTracker peers(*store_, hb_keys, options_.conf.heartbeat * kMissedHeartbeats);
  const auto deadline = deadline_after(limit);
  const Millis poll = std::min<Millis>(options_.conf.heartbeat / 2 + Millis(1), Millis(200));
  for (;;) {
    const std::vector<bool> gone = peers.poll();
    auto now = Clock::now();
    const bool all = std::all_of(gone.begin(), gone.end(), [](bool g) { return g; });
    if (all) return true;
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(poll, deadline - now));
  }
}

TimeoutDiagnosis Rendezvous::diagnose(int64_t g, const std::string& phase, Millis waited) {
  TimeoutDiagnosis d;
  d.phase = phase;
  d.endpoint = net::format_endpoint(options_.endpoint.host, options_.endpoint.port);
  d.run_id = options_.run_id;
  d.backend = options_.backend;
  d.generation = g;
  d.min_nodes = options_.nodes.min;
  d.max_nodes = options_.nodes.max;
  d.waited = waited;
  d.limit = options_.conf.join_timeout;
  constexpr int kListed = 64;
  keys::Round k(options_.run_id, g);
  auto read_node = [&](int i) -> std::optional<JoinedNode> {
    if (!store_->check({k.node(i)})) return std::nullopt;
    return decode_node_info(store_->get(k.node(i)), i, k.node(i));
  };
  if (options_.backend == Backend::kStatic) {
    for (int i = 0; i < options_.nodes.max; ++i) {
      auto n = read_node(i);
      if (n) {
        ++d.joined_count;
        if (static_cast<int>(d.joined.size()) < kListed) d.joined.push_back(*n);
      } else {
        d.missing_ranks.push_back(i);
      }
    }
  } else {
    int count = static_cast<int>(store_->add(k.slot(), 0));
    d.joined_count = count;
    for (int i = 0; i < std::min(count, kListed); ++i) {
      if (auto n = read_node(i)) d.joined.push_back(*n);
    }
    for (int i = count; i < options_.nodes.min; ++i) d.missing_ranks.push_back(i);
  }
  int64_t runs = store_->add(keys::kRunsCount, 0);
  std::map<std::string, OtherRun> others;
  for (int64_t i = 0; i < std::min<int64_t>(runs, 1024); ++i) {
    std::string key = keys::run_entry(i);
    if (!store_->check({key})) continue;
    std::string entry = store_->get(key);
    auto tab = entry.find('\t');
    std::string id = entry.substr(0, tab);
    if (id == options_.run_id) continue;
    auto& o = others[id];
    o.run_id = id;
    o.hosts.push_back(tab == std::string::npos ? "?" : entry.substr(tab + 1));
  }
  for (auto& [id, o] : others) d.other_runs.push_back(std::move(o));
  return d;
}

void Rendezvous::throw_timeout(int64_t g, const std::string& phase, Clock::time_point start) {
  auto waited = std::chrono::duration_cast<Millis>(Clock::now() - start);
  TimeoutDiagnosis d;
  try {
    d = diagnose(g, phase, waited);
  } catch (const Error& e) {
    // The store went away while diagnosing: report what is known.
    d.phase = phase + " (the store failed while diagnosing: " + e.what() + ")";
    d.endpoint = net::format_endpoint(options_.endpoint.host, options_.endpoint.port);
    d.run_id = options_.run_id;
    d.backend = options_.backend;
    d.generation = g;
    d.min_nodes = options_.nodes.min;
    d.max_nodes = options_.nodes.max;
    d.waited = waited;
    d.limit = options_.conf.join_timeout;
  }
  throw RendezvousTimeoutError(std::move(d));
}

}  // namespace ddp::rdzv
