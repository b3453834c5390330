#include "stack_requests.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "ddp/launcher/stack_service.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp::launcher::detail {

namespace {

constexpr StackRequestChannel::Clock::time_point kNotMissing =
    StackRequestChannel::Clock::time_point::max();

// What an asker leaves in an answer slot that had no answer when it stopped waiting (never a
// valid encode_stacks text).
const std::string kClosed = "closed";

}  // namespace

void warn_stacks(const std::string& text) {
  ddp::log::get("ddp.launcher")->warn("ddprun stacks: {}", text);
}

StackRequestChannel::StackRequestChannel(Store& store, std::string prefix, int node_rank,
                                         int num_nodes, Capture capture, int64_t first)
    : store_(store),
      prefix_(std::move(prefix)),
      me_(node_rank),
      nodes_(num_nodes),
      capture_(std::move(capture)),
      next_(first > 0 ? first : first_request(store_, prefix_)),
      missing_since_(kNotMissing) {
  // A request its asker deleted between our check and our get must not hold the round's
  // thread for the store's default wait (300 s): the store is this channel's own connection.
  store_.set_timeout(kAbandonedRequest);
}

int64_t StackRequestChannel::first_request(Store& store, const std::string& prefix) {
  return store.add(prefix + "seq", 0) + 1;
}

int64_t StackRequestChannel::reserve_request_id(Store& store, const std::string& prefix) {
  return store.add(prefix + "seq", 1);
}

void StackRequestChannel::cancel_request(Store& store, const std::string& prefix, int64_t id) {
  store.set(fmt::format("{}req/{}", prefix, id), "-1 0");
}

std::vector<std::string> StackRequestChannel::ask(Clock::time_point deadline,
                                                  std::chrono::milliseconds slice,
                                                  int64_t reserved) {
  const int64_t id = reserved > 0 ? reserved : store_.add(prefix_ + "seq", 1);
  const auto budget =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  // "<asking node> <milliseconds>": the others capture within the asker's budget.
  store_.set(fmt::format("{}req/{}", prefix_, id),
             fmt::format("{} {}", me_, std::max<int64_t>(budget.count(), 100)));
  std::vector<std::string> keys;
  for (int n = 0; n < nodes_; ++n) {
    if (n != me_) keys.push_back(answer_key(id, n));
  }
  try {
    while (!keys.empty()) {
      serve_posted();
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      try {
        store_.wait(keys, std::min(left, slice));
        break;
      } catch (const TimeoutError&) {
      }
    }
  } catch (const TimeoutError&) {
    // A store call answered late (serving another node's request): this ask is lost; its
    // request goes, so the other nodes leave no answers to it behind.
    try {
      store_.delete_key(fmt::format("{}req/{}", prefix_, id));
    } catch (const Error&) {
    }
    throw;
  }
  // Each answer slot is closed atomically (compare_set: the answer, or kClosed where none came
  // yet), then the request goes, then the slots. An answer is thus either taken here or seen
  // by its writer as late (a closed slot, or the request gone after it wrote): it deletes it
  // itself (serve_request), so no key of this request outlives it. Deleting the request first
  // lost answers: an answerer that wrote just before it and checked just after deleted an
  // answer not read yet (CI, StacksWithTools.AStoreCallAnsweredLateCostsTheRequestNotTheRound).
  std::vector<std::string> answers(nodes_);
  for (int n = 0; n < nodes_; ++n) {
    if (n == me_) continue;
    const std::string got = store_.compare_set(answer_key(id, n), "", kClosed);
    if (got != kClosed) answers[n] = got;
  }
  store_.delete_key(fmt::format("{}req/{}", prefix_, id));
  for (int n = 0; n < nodes_; ++n) {
    if (n != me_) store_.delete_key(answer_key(id, n));
  }
  return answers;
}

void StackRequestChannel::drain(Clock::time_point deadline, std::chrono::milliseconds slice) {
  const int64_t last_taken = store_.add(prefix_ + "seq", 0);
  while (next_ <= last_taken) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return;
    serve_for(std::min(left, slice));
  }
}

void StackRequestChannel::serve_for(std::chrono::milliseconds wait) {
  if (serve_request(wait)) {
    ++next_;
    missing_since_ = kNotMissing;
  } else if (abandoned()) {
    ++next_;
  }
}

bool StackRequestChannel::serve_request(std::chrono::milliseconds wait) {
  const std::string key = fmt::format("{}req/{}", prefix_, next_);
  if (wait.count() <= 0) {
    if (!store_.check({key})) return false;
  } else {
    try {
      store_.wait({key}, wait);
    } catch (const TimeoutError&) {
      return false;
    }
  }
  std::string value;
  try {
    value = store_.get(key);
  } catch (const TimeoutError&) {
    return true;  // its asker stopped waiting and deleted it: nothing to answer
  }
  const int from = std::atoi(value.c_str());
  const size_t space = value.find(' ');
  const int64_t budget_ms =
      std::clamp<int64_t>(space == std::string::npos ? 5000 : std::atoll(value.c_str() + space + 1),
                          100, StackService::kMaxCapture.count());
  if (from == me_ || from < 0) return true;  // this node's own, or cancelled
  // Only the store's errors end the round (they propagate); a capture or an encoding that
  // fails loses this answer, not the service.
  std::string encoded;
  try {
    // Answer a little before the asker stops waiting.
    encoded = encode_stacks(capture_(Clock::now() + std::chrono::milliseconds(budget_ms * 8 / 10)));
  } catch (const std::exception& e) {
    warn_stacks(fmt::format("request {} from node rank {} failed: {}", next_, from, e.what()));
    return true;
  }
  const std::string answer = answer_key(next_, me_);
  // The asker closes the answer slots when it stops waiting, then deletes its request, then
  // the slots (ask). A slot found closed, or an answer written after the request went, is
  // late: it would stay in the store for the round.
  if (store_.compare_set(answer, "", encoded) != encoded || !store_.check({key})) {
    store_.delete_key(answer);
  }
  return true;
}

std::string StackRequestChannel::answer_key(int64_t id, int node) const {
  return fmt::format("{}resp/{}/{}", prefix_, id, node);
}

bool StackRequestChannel::abandoned() {
  if (store_.add(prefix_ + "seq", 0) <= next_) {
    missing_since_ = kNotMissing;
    return false;
  }
  const auto now = Clock::now();
  if (missing_since_ == kNotMissing) missing_since_ = now;
  if (now - missing_since_ < kAbandonedRequest) return false;
  warn_stacks(fmt::format(
      "stack request {} is not in the store (its asker stopped before posting it, or stopped "
      "waiting and removed it before this node answered); serving the later ones",
      next_));
  missing_since_ = kNotMissing;
  return true;
}

void StackRequestChannel::serve_posted() {
  for (;;) {
    if (serve_request(std::chrono::milliseconds(0))) {
      ++next_;
      missing_since_ = kNotMissing;
    } else if (abandoned()) {
      ++next_;
    } else {
      return;
    }
  }
}

}  // namespace ddp::launcher::detail
