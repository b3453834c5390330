#include "job_store.hpp"

#include <fmt/format.h>

#include "c10d_bytes.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::python {

JobStore::JobStore(TcpStoreOptions options) : options_(std::move(options)) {
  options_.is_server = false;
  store_ = std::make_unique<TcpStore>(options_);
  timeout_ = options_.timeout;
}

c10::intrusive_ptr<c10d::Store> JobStore::clone() {
  TcpStoreOptions o = options_;
  o.timeout = timeout_;
  return c10::make_intrusive<JobStore>(o);
}

void JobStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  store_->set(key, to_string(value));
}

std::vector<uint8_t> JobStore::compareSet(const std::string& key,
                                          const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  return to_bytes(store_->compare_set(key, to_string(expected), to_string(desired)));
}

std::vector<uint8_t> JobStore::get(const std::string& key) {
  return to_bytes(store_->get(key, timeout_));
}

int64_t JobStore::add(const std::string& key, int64_t value) {
  return store_->add(key, value);
}

bool JobStore::deleteKey(const std::string& key) {
  return store_->delete_key(key);
}

bool JobStore::check(const std::vector<std::string>& keys) {
  return store_->check(keys);
}

int64_t JobStore::getNumKeys() {
  return store_->num_keys();
}

void JobStore::wait(const std::vector<std::string>& keys) {
  store_->wait(keys, timeout_);
}

void JobStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout);
}

namespace {

TcpStoreOptions job_store_options(std::chrono::milliseconds timeout) {
  const auto addr = env::get("MASTER_ADDR");
  const auto port = env::get_int("MASTER_PORT");
  if (!addr || addr->empty() || !port || *port <= 0 || *port > 65535) {
    throw UsageError(
        "ddp: the job's store is not set: MASTER_ADDR and MASTER_PORT must name the store "
        "ddprun hosts (launch with 'ddprun --recovery step')");
  }
  TcpStoreOptions o;
  o.host = *addr;
  o.port = static_cast<uint16_t>(*port);
  o.timeout = timeout;
  // The store outlives its host's loss on a promoted standby (docs/recovery.md).
  o.standbys = standbys_from_env();
  return o;
}

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_job_store(std::chrono::milliseconds timeout) {
  return c10::make_intrusive<JobStore>(job_store_options(timeout));
}

int64_t publish_lost_rank(int rank, std::chrono::milliseconds timeout) {
  TcpStore store(job_store_options(timeout));  // a client: is_server is false by default
  return recovery_notice::publish_lost_rank(store, rank);
}

}  // namespace ddp::python
