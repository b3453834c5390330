#pragma once
// A Store that counts the calls it forwards (rdzv_load's idle phase: store calls per second of
// N membership watchers). A store that offers InterruptibleWait (etcd) is wrapped in
// CountingInterruptibleStore, which offers it too, and one that also keeps keys alive (etcd:
// KeptAliveKeys, the watchers' heartbeats) in CountingKeptAliveStore, so the watcher behaves as
// on the bare store.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/store/kept_alive_keys.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/wait_interrupter.hpp"

namespace rdzv_load {

class CountingStore : public ddp::Store {
 public:
  CountingStore(std::shared_ptr<ddp::Store> inner, std::atomic<int64_t>& calls)
      : inner_(std::move(inner)), calls_(calls) {
    set_timeout(inner_->timeout());
  }
  void set(const std::string& k, const std::string& v) override { count(), inner_->set(k, v); }
  std::string get(const std::string& k) override { return count(), inner_->get(k); }
  int64_t add(const std::string& k, int64_t d) override { return count(), inner_->add(k, d); }
  std::string compare_set(const std::string& k, const std::string& e,
                          const std::string& d) override {
    return count(), inner_->compare_set(k, e, d);
  }
  bool delete_key(const std::string& k) override { return count(), inner_->delete_key(k); }
  int64_t num_keys() override { return count(), inner_->num_keys(); }
  bool check(const std::vector<std::string>& keys) override { return count(), inner_->check(keys); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    count(), inner_->wait(keys, t);
  }
  using Store::wait;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override {
    return count(), inner_->multi_get(keys);
  }
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override {
    count(), inner_->multi_set(keys, values);
  }

 protected:
  void count() { calls_.fetch_add(1, std::memory_order_relaxed); }
  std::shared_ptr<ddp::Store> inner_;
  std::atomic<int64_t>& calls_;
};

class CountingInterruptibleStore : public CountingStore, public ddp::InterruptibleWait {
 public:
  using CountingStore::CountingStore;
  ddp::WaitOutcome wait_interruptibly(const std::vector<std::string>& keys,
                                      std::chrono::milliseconds timeout,
                                      ddp::WaitInterrupter& interrupter) override {
    count();
    return dynamic_cast<ddp::InterruptibleWait&>(*inner_).wait_interruptibly(keys, timeout,
                                                                             interrupter);
  }
};

class CountingKeptAliveStore : public CountingInterruptibleStore, public ddp::KeptAliveKeys {
 public:
  using CountingInterruptibleStore::CountingInterruptibleStore;
  void keep_alive(const std::string& key, const std::string& value,
                  std::chrono::milliseconds ttl) override {
    count();
    dynamic_cast<ddp::KeptAliveKeys&>(*inner_).keep_alive(key, value, ttl);
  }
  std::vector<std::optional<std::string>> read_now(const std::vector<std::string>& keys) override {
    count();
    return dynamic_cast<ddp::KeptAliveKeys&>(*inner_).read_now(keys);
  }
};

// `store` wrapped so that its calls are counted in `calls`, with the capabilities it has.
inline std::shared_ptr<ddp::Store> counting(std::shared_ptr<ddp::Store> store,
                                            std::atomic<int64_t>& calls) {
  if (dynamic_cast<ddp::InterruptibleWait*>(store.get()) != nullptr &&
      dynamic_cast<ddp::KeptAliveKeys*>(store.get()) != nullptr) {
    return std::make_shared<CountingKeptAliveStore>(std::move(store), calls);
  }
  if (dynamic_cast<ddp::InterruptibleWait*>(store.get()) != nullptr) {
    return std::make_shared<CountingInterruptibleStore>(std::move(store), calls);
  }
  return std::make_shared<CountingStore>(std::move(store), calls);
}

}  // namespace rdzv_load
