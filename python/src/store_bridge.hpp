#pragma once
// C10dStoreBridge: ddp's Store interface over the c10d::Store PyTorch hands a backend (a
// PrefixStore over the TCPStore / FileStore / HashStore of init_process_group), so the ddp
// backend rendezvouses through the job's own store: no second store, no extra port.
//
// Blocking waits are polls of check() (bounded by the caller's timeout) rather than c10d's
// wait(): a c10d TCPStore wait that times out leaves a late reply on its socket that would be
// read as the answer to the next request, and ddp's error paths keep using the store after a
// timeout (to name the ranks that never arrived). A timeout is a ddp::TimeoutError naming
// the keys, as ddp's own stores do.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ddp/store/store.hpp"

namespace ddp::python {

class C10dStoreBridge : public Store {
 public:
  explicit C10dStoreBridge(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace ddp::python
