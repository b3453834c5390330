#pragma once
// PrefixStore: a view of another Store where every key is "prefix/key" (c10d's PrefixStore).
// Used to give each rendezvous round, process group or job its own key space on one server.
//
// num_keys() counts every key of the underlying store, whatever its prefix (as in c10d).
// Blocking calls use this object's timeout(), which starts as the inner store's.

#include <memory>
#include <string>
#include <vector>

#include "ddp/store/store.hpp"

namespace ddp {

class PrefixStore : public Store {
 public:
  // Throws UsageError if inner is null or prefix is empty.
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& inner() const { return inner_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace ddp
