#include "store_bridge.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <thread>

#include "c10d_bytes.hpp"
#include "ddp/util/error.hpp"

namespace ddp::python {

namespace {

// c10d reports failures as c10::Error or std::exception; ddp code expects its own hierarchy.
template <typename F>
auto forward(const char* what, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ddp::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw StoreError(
        fmt::format("torch.distributed store: {}('{}') failed: {}", what, key, e.what()));
  }
}

}  // namespace

C10dStoreBridge::C10dStoreBridge(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  if (!store_) throw UsageError("ddp backend: torch.distributed passed no store");
  set_timeout(store_->getTimeout());
}

void C10dStoreBridge::set(const std::string& key, const std::string& value) {
  forward("set", key, [&] { store_->set(key, to_bytes(value)); });
}

std::string C10dStoreBridge::get(const std::string& key) {
  wait({key}, timeout_);
  return forward("get", key, [&] { return to_string(store_->get(key)); });
}

int64_t C10dStoreBridge::add(const std::string& key, int64_t delta) {
  return forward("add", key, [&] { return store_->add(key, delta); });
}

std::string C10dStoreBridge::compare_set(const std::string& key, const std::string& expected,
                                         const std::string& desired) {
  return forward("compare_set", key, [&] {
    return to_string(store_->compareSet(key, to_bytes(expected), to_bytes(desired)));
  });
}

bool C10dStoreBridge::delete_key(const std::string& key) {
  return forward("delete_key", key, [&] { return store_->deleteKey(key); });
}

int64_t C10dStoreBridge::num_keys() {
  return forward("num_keys", "", [&] { return store_->getNumKeys(); });
}

bool C10dStoreBridge::check(const std::vector<std::string>& keys) {
  return forward("check", keys.empty() ? std::string() : keys.front(),
                 [&] { return store_->check(keys); });
}

void C10dStoreBridge::wait(const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(50);
  while (!check(keys)) {
    const auto elapsed = Clock::now() - start;
    if (elapsed >= timeout) {
      throw TimeoutError(fmt::format(
          "torch.distributed store: waited {} ms for keys [{}] (limit {} ms); they were never "
          "set",
          std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(),
          fmt::join(keys, ", "), timeout.count()));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, timeout - elapsed));
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
  }
}

}  // namespace ddp::python
