#pragma once
// How the agents of a multi-node round ask each other for their workers' stacks, through the
// round's store (the protocol of StackService's round thread). Internal header.
//
// Keys under `prefix` (one per run and generation): `seq` hands out request ids (add); an asker
// takes id N and sets `req/N` to "<its node rank> <milliseconds it waits>"; every other node
// answers with `resp/N/<its node rank>` (encode_stacks). Requests are served in id order; an id
// taken but never posted (its asker died in between), or removed by its asker before this node
// answered (the asker's deadline passed), is passed over after kAbandonedRequest. When the
// asker stops waiting it closes every answer slot atomically (taking what is there), then
// removes the request and the slots; an answer that finds its slot closed or the request gone
// is late and removed by its writer.
// A node whose worker failed takes its id before it ends the round (reserve_request_id): a node
// that sees the round end then knows a request is coming and answers it before it leaves
// (drain). A reserved id that is not asked with is cancelled (req/N = "-1 0": passed over).
// Not thread-safe: one thread (the round's) drives a channel.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "ddp/launcher/stacks.hpp"
#include "ddp/store/store.hpp"

namespace ddp::launcher::detail {

class StackRequestChannel {
 public:
  using Clock = std::chrono::steady_clock;
  // This node's workers' stacks, captured by the deadline.
  using Capture = std::function<std::vector<RankStacks>(Clock::time_point)>;

  // How long a request id may stay without its request before the nodes pass over it: an
  // asker sets req/<id> right after taking the id, and one that died in between must not stop
  // every later request of the round (issue 49, finding 5).
  static constexpr std::chrono::milliseconds kAbandonedRequest{2000};

  // Starts at request `first` (from first_request(): the node's join_round takes it before it
  // returns, so every request posted after the node joined is served), or, with 0, after the
  // requests already posted now (they were for earlier members of the round). Store errors
  // propagate from every call; the caller (StackService's round thread) takes a TimeoutError
  // for a late reply and tries again, any other for the end of the round.
  StackRequestChannel(Store& store, std::string prefix, int node_rank, int num_nodes,
                      Capture capture, int64_t first = 0);

  // The id of the next request to be posted under `prefix`: where a channel made now starts.
  static int64_t first_request(Store& store, const std::string& prefix);

  // Asks the other nodes and returns each node's answer by node rank ("" for none and for
  // this node) by `deadline`. Serves the other nodes' requests while it waits: when a round
  // ends every node captures at the same moment, and two nodes that only waited would each
  // wait out the other.
  // `reserved`: an id from reserve_request_id (0: take one now).
  std::vector<std::string> ask(Clock::time_point deadline, std::chrono::milliseconds slice,
                               int64_t reserved = 0);

  // Before the round thread stops: serves every request whose id was taken by now (the failing
  // node's, reserved before it ended the round), passing over abandoned ones, until `deadline`.
  void drain(Clock::time_point deadline, std::chrono::milliseconds slice);

  // Serves the next request if it is posted within `wait`, or passes over an abandoned id.
  void serve_for(std::chrono::milliseconds wait);

  // Takes a request id for a later ask (any thread; the store serialises).
  static int64_t reserve_request_id(Store& store, const std::string& prefix);
  // Posts a reserved id as cancelled: the other nodes pass over it at once.
  static void cancel_request(Store& store, const std::string& prefix, int64_t id);

 private:
  // Request `next_`, if it is there within `wait` (0: only if it is there now): another
  // node's is answered with this node's stacks, this node's own is passed over. Returns
  // whether there was one (then `next_` moves on).
  bool serve_request(std::chrono::milliseconds wait);
  // Whether request `next_` was abandoned: a later id was taken, and `next_` has had no
  // request for kAbandonedRequest.
  bool abandoned();
  // Serves the requests that are there now, in order, passing over abandoned ids.
  void serve_posted();
  // Where node `node` answers request `id`.
  std::string answer_key(int64_t id, int node) const;

  Store& store_;
  std::string prefix_;
  int me_, nodes_;
  Capture capture_;
  int64_t next_;                     // the next request id to serve
  Clock::time_point missing_since_;  // since when request next_ has been seen missing
};

// Logs `text` as a warning of `ddprun stacks` (logger "ddp.launcher").
void warn_stacks(const std::string& text);

}  // namespace ddp::launcher::detail
