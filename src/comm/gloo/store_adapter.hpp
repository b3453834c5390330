#pragma once
// StoreAdapter: a ddp::Store seen through gloo::rendezvous::Store, with every key under a
// prefix so several Gloo contexts can rendezvous on one store (internal header). It keeps what
// it read, for the caller to look at after the rendezvous (fetched()).

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/store/store.hpp"

namespace ddp::detail {

class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<ddp::Store> store, std::string prefix,
               std::chrono::milliseconds timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::string(data.begin(), data.end()));
  }

  std::vector<char> get(const std::string& key) override {
    store_->wait({prefix_ + key}, timeout_);
    const std::string v = store_->get(prefix_ + key);
    std::vector<char> value(v.begin(), v.end());
    fetched_[key] = value;
    return value;
  }

  // The last value get() returned for `key` (without the prefix); empty if it never read it.
  std::vector<char> fetched(const std::string& key) const {
    const auto it = fetched_.find(key);
    return it == fetched_.end() ? std::vector<char>{} : it->second;
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_->wait(full, timeout);
  }

 private:
  std::shared_ptr<ddp::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, std::vector<char>> fetched_;
};

}  // namespace ddp::detail
