#include "ddp/launcher/rendezvous_membership.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "ddp/launcher/output.hpp"
#include "ddp/launcher/process.hpp"
#include "ddp/rendezvous/endpoint_store.hpp"
#include "ddp/rendezvous/etcd/etcd_store.hpp"
#include "ddp/rendezvous/membership_watcher.hpp"
#include "ddp/rendezvous/rendezvous.hpp"
#include "ddp/store/auth.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::launcher {

namespace {

// Longest store request of a progress line's count (join_progress.hpp).
constexpr rdzv::Millis kCountRequestLimit{5000};

class RendezvousMembership : public Membership {
 public:
  explicit RendezvousMembership(RendezvousMembershipOptions options)
      : options_(std::move(options)) {}

  ~RendezvousMembership() override { stop_watching(); }

  MembershipRound next_round() override {
    connect_once();
    rdzv::RoundInfo r;
    for (;;) {
      try {
        r = join_reporting_progress();
        break;
      } catch (const rdzv::RendezvousTimeoutError&) {
        linger();
        throw;
      } catch (const rdzv::RendezvousClosedError& e) {
        if (!rdzv::uses_etcd(options_.rdzv.backend) || joined_once_) throw;
        // etcd keeps a run's keys key_ttl after its last agent: a new job reusing the id of
        // one that was shut down moments ago finds its shutdown key.
        throw rdzv::RendezvousClosedError(fmt::format(
            "{} (etcd keeps a run's keys for key_ttl={:.0f} s after its last agent exits: if "
            "that was an earlier job, wait that long or pass a new --rdzv-id)",
            e.what(), options_.rdzv.conf.key_ttl.count() / 1000.0));
      } catch (const Error& e) {
        if (etcd_ || !store_lost(e)) throw;
        if (fail_over(e.what())) continue;
        throw NetworkError(fmt::format(
            "lost the rendezvous store at {} while joining (did the agent on the endpoint host "
            "exit? see its output): {}",
            net::format_endpoint(store_->endpoint().host, store_->port()), e.what()));
      }
    }
    joined_once_ = true;
    standbys_ = r.standbys;
    // The round and everything after it are copied to its standbys before any write is
    // answered, so the store outlives this node (docs/rendezvous.md).
    if (hosting()) store_->replicate_to(r.standbys);
    MembershipRound out;
    out.generation = static_cast<int>(r.generation);
    out.took_lost_slot = r.took_lost_slot;
    out.grew_round = r.grew_round;
    out.formed_nodes = r.formed_nodes;
    out.launch_world_size = r.launch_world_size;
    WorldAssignment& w = out.world;
    w.group_rank = r.node_rank;
    w.group_world_size = r.num_nodes;
    w.local_world_size = r.local_world_size;
    w.world_size = r.world_size;
    w.role_world_size = r.world_size;
    w.master_addr = options_.master_addr.value_or(r.master_addr);
    w.master_port = r.master_port;
    for (int local = 0; local < r.local_world_size; ++local) {
      WorkerIdentity id;
      id.local_rank = local;
      id.global_rank = r.rank_offset + local;
      id.role_rank = id.global_rank;
      w.workers.push_back(id);
    }
    std::string hosts;
    for (const auto& n : r.nodes) hosts += (hosts.empty() ? "" : ", ") + n.host;
    out.summary = fmt::format(
        "rendezvous round {} of run '{}': {} node{}{}, {} workers; this is node {} (ranks "
        "{}-{}); master {}",
        r.generation, options_.rdzv.run_id, r.num_nodes, r.num_nodes == 1 ? "" : "s",
        hosts.empty() ? "" : " (" + hosts + ")", r.world_size, r.node_rank, r.rank_offset,
        r.rank_offset + r.local_world_size - 1,
        net::format_endpoint(w.master_addr, static_cast<uint16_t>(r.master_port)));
    if (r.took_lost_slot) {
      out.summary += "; joined while the round ran, in the place of a node it lost";
    }
    if (r.grew_round) {
      out.summary += fmt::format("; joined while the round ran and grew it past its {} workers",
                                 r.launch_world_size);
    }
    return out;
  }

  int start_watching() override {
    stop_watching();
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(
          fmt::format("cannot create a pipe for the membership watcher: {}", std::strerror(errno)));
    }
    wake_read_.reset(fds[0]);
    wake_write_.reset(fds[1]);
    int w = wake_write_.get();
    // The watcher shares the agent's connection: the agent makes no store call until
    // stop_watching() joins the watcher, and a second connection per agent would make every
    // agent of a large job connect at once after the round (1024 agents: 1024 connections
    // and file descriptors more at a store host that is already busy).
    rdzv::MembershipWatcher::OnPeerLost on_peer_lost;
    if (lost_node_handler_) {
      on_peer_lost = [handler = lost_node_handler_](const rdzv::LostPeer& p) {
        return handler(LostNode{p.node_rank, p.first_rank, p.num_ranks, p.why});
      };
    }
    // --recovery step: the round goes on when the store's host is lost; its promoted standby
    // holds the round, and the host's node is then lost like any other (on_peer_lost).
    rdzv::MembershipWatcher::OnStoreLost on_store_lost;
    if (lost_node_handler_ && !etcd_) {
      on_store_lost = [this](const Error& e) -> std::shared_ptr<Store> {
        if (!store_lost(e) || !fail_over(e.what(), /*same_round=*/true)) return nullptr;
        return client_;
      };
    }
    watcher_ = std::make_unique<rdzv::MembershipWatcher>(
        options_.rdzv, rdzv_->round(), client_,
        [w](const std::string&) {
          char byte = 1;
          (void)!::write(w, &byte, 1);
        },
        std::move(on_peer_lost), std::move(on_store_lost));
    return wake_read_.get();
  }

  void set_lost_node_handler(LostNodeHandler handler) override {
    lost_node_handler_ = std::move(handler);
  }

  std::optional<std::string> stop_watching() override {
    if (!watcher_) return std::nullopt;
    watcher_->stop();
    auto reason = watcher_->reason();
    std::exception_ptr store_error = watcher_->store_error();
    watcher_.reset();
    wake_read_.reset();
    wake_write_.reset();
    // The store's host died while the workers ran: move to a standby store now, so sharing
    // the hang records and the next round use it (and nobody waits on the dead endpoint).
    if (store_error) fail_over_after(store_error);
    return reason;
  }

  std::string end_round(const std::string& reason) override {
    try {
      return rdzv_->request_new_round(reason);
    } catch (const Error& e) {
      // The store's host is gone (this node's workers failed with it): the next round forms
      // on a standby store, where the lost round does not exist.
      if (etcd_ || !store_lost(e) || !fail_over(e.what())) throw;
      return "";
    }
  }

  void finished() override {
    best_effort("report this node as finished", [&] { rdzv_->mark_finished(); });
    wait_for_peers_if_hosting("finished");
  }

  void leave(const std::string& reason) override {
    if (rdzv_) best_effort("tell the other nodes", [&] { rdzv_->mark_left(reason); });
  }

  bool end_round_while_watching(const std::string& reason) override {
    if (!watcher_) return false;
    watcher_->request_end(reason);
    return true;
  }

  void finish_if_shut_down() override {
    bool shut = false;
    best_effort("read whether the run was shut down",
                [&] { shut = rdzv_ && rdzv_->shutdown_reason().has_value(); });
    if (shut) finished();
  }

  void shut_down(const std::string& reason) override {
    best_effort("shut the run down", [&] { rdzv_->shutdown(reason); });
    // This node is done with the round: the node hosting the store need not wait out its
    // heartbeats before it goes.
    best_effort("report this node as done", [&] { rdzv_->mark_finished(); });
    wait_for_peers_if_hosting("shut the run down");
  }

  // The store must outlive its users: the node hosting it waits until every peer of the round
  // marked itself done or left, or stopped heartbeating (rendezvous.hpp), at most exit_barrier.
  void wait_for_peers_if_hosting(const char* what) {
    if (!hosting()) return;
    best_effort("wait for the other nodes", [&] {
      if (!rdzv_->wait_for_peers_to_finish(options_.exit_barrier)) {
        notice(
            fmt::format("other nodes were still running {:.0f} s after this node {}; closing the "
                        "rendezvous store anyway",
                        options_.exit_barrier.count() / 1000.0, what));
      }
    });
  }

  std::shared_ptr<Store> connect_side_store() override {
    if (etcd_) {
      if (!etcd_authenticated()) return nullptr;
      return std::make_shared<rdzv::EtcdStore>(rdzv::etcd_store_options(options_.rdzv));
    }
    if (!store_ || !store_authenticated()) return nullptr;
    return store_->connect_another();
  }

  std::string why_no_side_store() const override {
    if (etcd_ && !etcd_authenticated()) {
      return "the other nodes cannot be asked: the job's etcd is reached without a client "
             "certificate, and ddprun serves stack requests from other nodes only over an "
             "authenticated store; run etcd with --client-cert-auth and give every node "
             "--rdzv-conf protocol=https,cacert=CA,cert=CERT,key=KEY, or run `ddprun stacks` "
             "on each node";
    }
    if (store_ && !store_authenticated()) {
      return "the other nodes cannot be asked: the job's store has no auth token, and ddprun "
             "serves stack requests from other nodes only over an authenticated store; give "
             "every node the job's token (--rdzv-conf token_file=FILE, or DDP_STORE_TOKEN / "
             "DDP_STORE_TOKEN_FILE), or run `ddprun stacks` on each node";
    }
    return "";
  }

  // Whether this node reaches etcd with a client certificate over TLS: an etcd that requires
  // one (--client-cert-auth) admits only holders of a certificate its CA signed, as a token
  // does for the TCP store.
  bool etcd_authenticated() const {
    return options_.rdzv.conf.https && options_.rdzv.conf.cert.has_value();
  }

  // Whether this node's store connections carry a token: a client with a token refuses a
  // server that cannot prove it has the same one, so then the store is authenticated.
  bool store_authenticated() const {
    try {
      return !store_auth::resolve_token(options_.token).empty();
    } catch (const Error&) {
      return false;
    }
  }

  // Keys "ddprun_hang/<run id>/<generation>/<node rank>" in the rendezvous store; the agent
  // calls this after stop_watching(), so it owns the connection.
  std::vector<std::string> exchange_hang_records(int generation, const std::string& mine,
                                                 std::chrono::milliseconds limit) override {
    if (!rdzv_ || !rdzv_->in_round()) return {mine};
    const rdzv::RoundInfo& round = rdzv_->round();
    std::vector<std::string> keys;
    for (int n = 0; n < round.num_nodes; ++n) {
      keys.push_back(fmt::format("ddprun_hang/{}/{}/{}", options_.rdzv.run_id, generation, n));
    }
    std::vector<std::string> out(keys.size());
    out[round.node_rank] = mine;
    best_effort("share the hang report records", [&] {
      Store& store = *client_;
      store.set(keys[round.node_rank], mine.empty() ? std::string("{}") : mine);
      if (limit.count() <= 0) return;
      try {
        store.wait(keys, limit);
      } catch (const TimeoutError&) {
      }
      for (size_t n = 0; n < keys.size(); ++n) {
        if (static_cast<int>(n) == round.node_rank || !store.check({keys[n]})) continue;
        const std::string v = store.get(keys[n]);
        out[n] = v == "{}" ? "" : v;
      }
    });
    return out;
  }

 private:
  void notice(const std::string& text) {
    std::string line = "ddprun: " + text + "\n";
    write_fully(options_.notice_fd, line.data(), line.size());
  }

  // rdzv_->next_round() with the progress lines of join_progress.hpp while it waits. They
  // stop before it returns or throws, so none follows the round's summary or the error.
  rdzv::RoundInfo join_reporting_progress() {
    const rdzv::RendezvousOptions& o = options_.rdzv;
    JoinWait wait;
    wait.backend = o.backend;
    wait.run_id = o.run_id;
    wait.endpoint =
        etcd_ ? etcd_->describe() : net::format_endpoint(store_->endpoint().host, store_->port());
    wait.serves_store = hosting();
    wait.node_rank = o.backend == rdzv::Backend::kStatic ? o.node_rank : -1;
    wait.nodes = o.nodes;
    wait.limit = o.conf.join_timeout;
    JoinProgress progress(std::move(wait), options_.progress_interval, arrival_counter(),
                          [this](const std::string& line) { notice(line); });
    return rdzv_->next_round();
  }

  // How the progress lines count the nodes that arrived (join_progress.hpp says when they do).
  JoinProgress::Counter arrival_counter() {
    const rdzv::RendezvousOptions& o = options_.rdzv;
    JoinProgress::Counter c;
    // c10d: which round this node will join is known only once it joined, and a late joiner
    // may move through several; the line then names the node range without a count.
    if (o.backend != rdzv::Backend::kStatic) return c;
    if (!hosting() && o.nodes.max > kCountedByEveryNode) {
      c.uncounted = fmt::format(
          "in jobs of more than {} nodes only the ddprun serving the store counts arrivals",
          kCountedByEveryNode);
      return c;
    }
    // Static rounds never skip a generation: the first join is round 0 of the store that
    // node 0 started, a later one the round after this node's last.
    const int64_t g = rdzv_->in_round() ? rdzv_->round().generation + 1 : 0;
    c.uncounted = fmt::format("not counted: round {} in the store does not list this node", g);
    // The reporter thread alone runs this, so the connection it opens (and keeps) is its own.
    c.count = [endpoint = store_.get(), o, g,
               connection = std::shared_ptr<Store>()]() mutable -> std::optional<JoinCount> {
      if (!connection) {
        connection = endpoint->connect_another();
        // Bounds each request of a count; stopping the reporter waits for the count in flight.
        connection->set_timeout(kCountRequestLimit);
      }
      return count_static_arrivals(connection, o, g);
    };
    return c;
  }

  // The store host's rendezvous failed: keep serving while other agents are still connected
  // (up to a limit), so they reach their own diagnosis instead of "connection closed".
  void linger() {
    TcpStoreServer* server = store_ ? store_->server() : nullptr;
    if (server == nullptr) return;
    auto limit = std::min(options_.rdzv.conf.join_timeout, rdzv::Millis(60000));
    auto until = deadline_after(limit);
    while (server->num_connections() > 1 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  template <class F>
  void best_effort(const char* what, F&& f) {
    try {
      f();
    } catch (const Error& e) {
      notice(fmt::format("could not {} through the rendezvous store: {}", what, e.what()));
    }
  }

  bool hosting() const { return store_ && store_->is_host(); }

  // Whether `e`, from a call to the TCP store, means the store is gone: the connection broke,
  // or a call got no reply and a new connection cannot be opened either (a host that vanished
  // without closing its sockets). A rendezvous wait that timed out is not.
  bool store_lost(const Error& e) {
    if (!store_ || hosting()) return false;
    if (dynamic_cast<const NetworkError*>(&e) != nullptr) return true;
    if (dynamic_cast<const TimeoutError*>(&e) == nullptr) return false;
    try {
      store_->connect_another();
      return false;
    } catch (const Error&) {
      return true;
    }
  }

  // fail_over() when `error` means the store is lost; a failure to move is only noticed here
  // (the next store call reports the lost store).
  void fail_over_after(const std::exception_ptr& error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      if (etcd_ || !store_lost(e)) return;
      try {
        fail_over(e.what());
      } catch (const Error& f) {
        notice(std::string("could not move to a standby store: ") + f.what());
      }
    } catch (...) {
    }
  }

  // The store was lost: this agent and its Rendezvous move to the first standby store of the
  // last round that answers, promoting it (this agent's own when it comes first: then it
  // serves the store). `same_round`: the round goes on there (the watcher's, --recovery step);
  // else the next round forms there. False when the last round named none to try (not in a
  // round yet, standby_stores=0, or every one tried already); a NetworkError naming each when
  // none answers. Runs on the watcher's thread while watching (the agent's thread makes no
  // store call then), else on the agent's.
  bool fail_over(const std::string& why, bool same_round = false) {
    if (!store_ || hosting() || standbys_.empty()) return false;
    const std::string lost = net::format_endpoint(store_->endpoint().host, store_->port());
    std::vector<std::string> candidates = std::exchange(standbys_, {});
    notice(fmt::format(
        "lost the rendezvous store at {} ({}); moving to the job's standby store (in order: {})",
        lost, why, fmt::join(candidates, ", ")));
    const std::string used =
        store_->fail_over(candidates, options_.rdzv.standby, options_.rdzv.conf.connect_timeout);
    // A later loss goes on with the standbys after this one.
    auto next = std::find(candidates.begin(), candidates.end(), used);
    standbys_.assign(next + 1, candidates.end());
    client_ = store_->store();
    if (same_round) {
      rdzv_->follow_store(client_);
    } else {
      rdzv_->move_to_store(client_);
    }
    if (hosting()) {
      options_.rdzv.standby.clear();
      rdzv_->set_standby("");
      notice(fmt::format("this node serves the rendezvous store now, at {} (its standby store)",
                         used));
    } else {
      notice(fmt::format("moved to the rendezvous store at {}", used));
    }
    return true;
  }

  void connect_once() {
    if (rdzv_) return;
    if (rdzv::uses_etcd(options_.rdzv.backend)) {
      // No agent serves the store: the etcd cluster does.
      etcd_ = std::make_shared<rdzv::EtcdStore>(rdzv::etcd_store_options(options_.rdzv));
      client_ = etcd_;
      rdzv_ = std::make_unique<rdzv::Rendezvous>(options_.rdzv, client_);
      return;
    }
    rdzv::EndpointStoreOptions so;
    so.endpoint = options_.rdzv.endpoint;
    so.token = options_.token;
    so.connect_timeout = options_.rdzv.conf.connect_timeout;
    so.host = options_.serve_store;
    try {
      store_ = std::make_unique<rdzv::EndpointStore>(so);
    } catch (const NetworkError& e) {
      if (!options_.serve_store || std::string(e.what()).find("in use") == std::string::npos) {
        throw;
      }
      notice(
          fmt::format("the rendezvous port {} is already served on this machine (another "
                      "agent of this job?); joining it as a client",
                      options_.rdzv.endpoint.port));
      so.host = false;
      store_ = std::make_unique<rdzv::EndpointStore>(so);
    }
    if (store_->is_host()) {
      // The server raised the soft limit to the hard one already; this reads it back.
      if (auto warning = rdzv::store_host_fd_warning(net::raise_fd_limit(), options_.rdzv.nodes.max,
                                                     options_.rdzv.local_world_size)) {
        notice(*warning);
      }
    }
    if (options_.rdzv.backend == rdzv::Backend::kC10d && !store_->is_host() &&
        options_.rdzv.conf.standby_stores > 0) {
      // Where the others go if the agent serving the store is lost; published with this
      // node's info, so node 0 can name the round's standbys (rendezvous.hpp).
      options_.rdzv.standby =
          net::format_endpoint(options_.rdzv.local_addr, store_->start_standby());
    }
    client_ = store_->store();
    rdzv_ = std::make_unique<rdzv::Rendezvous>(options_.rdzv, client_);
  }

  RendezvousMembershipOptions options_;
  // The TCP store (c10d, static) or the etcd cluster (etcd, etcd-v2); client_ is either's
  // connection of this agent.
  std::unique_ptr<rdzv::EndpointStore> store_;
  std::shared_ptr<rdzv::EtcdStore> etcd_;
  std::shared_ptr<Store> client_;
  bool joined_once_ = false;  // a round was formed with this agent in it
  // The last round's standby stores not tried yet ("HOST:PORT", in order of preference).
  std::vector<std::string> standbys_;
  std::unique_ptr<rdzv::Rendezvous> rdzv_;
  std::unique_ptr<rdzv::MembershipWatcher> watcher_;
  LostNodeHandler lost_node_handler_;  // --recovery step (set_lost_node_handler)
  UniqueFd wake_read_, wake_write_;
};

}  // namespace

std::unique_ptr<Membership> make_rendezvous_membership(RendezvousMembershipOptions options) {
  return std::make_unique<RendezvousMembership>(std::move(options));
}

}  // namespace ddp::launcher
