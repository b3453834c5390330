#include "ddp/store/hash_store.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

void HashStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

std::string HashStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    int64_t current = 0;
    if (it != data_.end()) {
      try {
        size_t used = 0;
        current = std::stoll(it->second, &used);
        if (used != it->second.size()) throw std::invalid_argument("trailing bytes");
      } catch (const std::exception&) {
        throw StoreError(fmt::format(
            "add on key '{}': its value is not an integer; use a key that only add() writes", key));
      }
    }
    result = current + delta;
    data_[key] = std::to_string(result);
  }
  changed_.notify_all();
  return result;
}

std::string HashStore::compare_set(const std::string& key, const std::string& expected,
                                   const std::string& desired) {
  std::string result;
  bool wrote = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    if ((it == data_.end() && expected.empty()) || (it != data_.end() && it->second == expected)) {
      data_[key] = desired;
      result = desired;
      wrote = true;
    } else {
      result = it == data_.end() ? expected : it->second;
    }
  }
  if (wrote) changed_.notify_all();
  return result;
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(data_.size());
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& key : keys) {
    if (data_.count(key) == 0) return false;
  }
  return true;
}

void HashStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (data_.count(key) == 0) return false;
    }
    return true;
  };
  if (changed_.wait_until(lock, deadline_after(timeout, start), all_present)) return;
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  throw TimeoutError(
      fmt::format("in-process store: timed out after {} ms (limit {} ms) waiting for keys [{}]",
                  elapsed.count(), timeout.count(), fmt::join(missing, ", ")));
}

}  // namespace ddp
