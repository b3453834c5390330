#pragma once
// Store: the key-value service ranks and agents use to find each other (c10d's Store).
//
// Values are arbitrary bytes held in std::string. Every blocking operation is bounded by the
// store's timeout (set_timeout) or an explicit one, and throws ddp::TimeoutError naming the
// endpoint, the keys, the elapsed time and the limit.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::seconds(300)};

  virtual ~Store() = default;

  // Sets key to value, waking every waiter on key.
  virtual void set(const std::string& key, const std::string& value) = 0;

  // Returns the value of key, waiting up to timeout() for it to be set.
  virtual std::string get(const std::string& key) = 0;

  // Adds delta to the integer stored at key (absent counts as 0; stored as decimal text, like
  // c10d) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Atomically: if key holds `expected` (or is absent and `expected` is empty), sets it to
  // `desired`. Returns the value the key holds afterwards.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;

  // Removes key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // Number of keys in the store (all prefixes).
  virtual int64_t num_keys() = 0;

  // Whether every key in keys is set, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Waits until every key in keys is set, or throws TimeoutError after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  // Batched forms; backends override them to use one round trip.
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys);
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values);

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 protected:
  std::chrono::milliseconds timeout_{kDefaultTimeout};
};

}  // namespace ddp
