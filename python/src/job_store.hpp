#pragma once
// JobStore: a c10d::Store (what torch.distributed takes) over a client of ddp's own TcpStore,
// the store ddprun hosts. Under `ddprun --recovery step` the job's store must outlive any
// rank, so ddprun hosts it at MASTER_ADDR:MASTER_PORT and no rank may (PyTorch's env:// would
// make rank 0 host a TCPStore there); `import ddp` then hands torch.distributed this store for
// env:// (python/ddp/recovery.py), and torch's own keys (group rendezvous, object
// collectives' sizes) live beside ddprun's recovery notices.
//
// ddp's store protocol is not PyTorch's TCPStore protocol (docs/store-protocol.md), hence
// this adapter rather than a torch TCPStore client. Timeouts and failures are ddp's errors
// (RuntimeError in Python) naming the endpoint and key.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "ddp/store/tcp_store.hpp"

namespace ddp::python {

class JobStore : public c10d::Store {
 public:
  // Connects a client to the ddp store at `options.host:port` (never hosts one).
  explicit JobStore(TcpStoreOptions options);

  c10::intrusive_ptr<c10d::Store> clone() override;  // a second connection
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  TcpStoreOptions options_;
  // ddp's TcpStore serializes its calls itself; c10d may call from several threads.
  std::unique_ptr<TcpStore> store_;
};

// A JobStore for this worker from the environment ddprun sets: MASTER_ADDR, MASTER_PORT and
// the job's token (DDP_STORE_TOKEN). UsageError naming what is missing.
c10::intrusive_ptr<c10d::Store> connect_job_store(std::chrono::milliseconds timeout);

// Publishes in the job's store that `rank` was lost, as ddprun does on a worker's death
// (recovery_notice::publish_lost_rank); returns the membership generation it opened. For
// tests that force a re-form without killing anything (bench/gpu/python_nccl_reform.py).
int64_t publish_lost_rank(int rank, std::chrono::milliseconds timeout);

}  // namespace ddp::python
