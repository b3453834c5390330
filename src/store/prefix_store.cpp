#include "ddp/store/prefix_store.hpp"

#include "ddp/util/error.hpp"

namespace ddp {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  if (!inner_) throw UsageError("PrefixStore: the inner store is null; pass an existing store");
  if (prefix_.empty()) {
    throw UsageError("PrefixStore: the prefix is empty; pass a name such as \"rdzv\"");
  }
  timeout_ = inner_->timeout();
}

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

void PrefixStore::set(const std::string& k, const std::string& value) {
  inner_->set(key(k), value);
}

std::string PrefixStore::get(const std::string& k) {
  // The inner get waits with the inner store's timeout; when this view's differs, wait with
  // ours first (one extra round trip) instead of mutating the shared inner store.
  if (timeout_ != inner_->timeout()) inner_->wait({key(k)}, timeout_);
  return inner_->get(key(k));
}

int64_t PrefixStore::add(const std::string& k, int64_t delta) {
  return inner_->add(key(k), delta);
}

std::string PrefixStore::compare_set(const std::string& k, const std::string& expected,
                                     const std::string& desired) {
  return inner_->compare_set(key(k), expected, desired);
}

bool PrefixStore::delete_key(const std::string& k) {
  return inner_->delete_key(key(k));
}

int64_t PrefixStore::num_keys() {
  return inner_->num_keys();
}

bool PrefixStore::check(const std::vector<std::string>& ks) {
  return inner_->check(keys(ks));
}

void PrefixStore::wait(const std::vector<std::string>& ks, std::chrono::milliseconds timeout) {
  inner_->wait(keys(ks), timeout);
}

std::vector<std::string> PrefixStore::multi_get(const std::vector<std::string>& ks) {
  auto prefixed = keys(ks);
  if (timeout_ != inner_->timeout()) inner_->wait(prefixed, timeout_);
  return inner_->multi_get(prefixed);
}

void PrefixStore::multi_set(const std::vector<std::string>& ks,
                            const std::vector<std::string>& values) {
  inner_->multi_set(keys(ks), values);
}

}  // namespace ddp
