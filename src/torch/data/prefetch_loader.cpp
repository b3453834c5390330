#include "ddp/torch/data/prefetch_loader.hpp"

#include <fmt/format.h>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

PrefetchLoader::PrefetchLoader(Fetch fetch, std::vector<int64_t> indices,
                               PrefetchLoaderOptions options)
    : fetch_(std::move(fetch)), indices_(std::move(indices)), options_(options) {
  if (options_.batch_size_ < 1 || options_.queue_depth_ < 1) {
    throw UsageError(
        fmt::format("PrefetchLoader: batch_size={} and queue_depth={} must both be "
                    "at least 1",
                    options_.batch_size_, options_.queue_depth_));
  }
  const int64_t n = static_cast<int64_t>(indices_.size());
  num_batches_ = options_.drop_last_ ? n / options_.batch_size_
                                     : (n + options_.batch_size_ - 1) / options_.batch_size_;
  producer_ = std::thread([this] { produce(); });
}

PrefetchLoader::PrefetchLoader(const TensorDataset& dataset, std::vector<int64_t> indices,
                               PrefetchLoaderOptions options)
    : PrefetchLoader([&dataset](const std::vector<int64_t>& idx) { return dataset.get_batch(idx); },
                     std::move(indices), options) {}

PrefetchLoader::~PrefetchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  producer_.join();
}

void PrefetchLoader::produce() {
  for (int64_t b = 0; b < num_batches_; ++b) {
    Item item;
    try {
      const auto first = indices_.begin() + b * options_.batch_size_;
      const auto last =
          b * options_.batch_size_ + options_.batch_size_ >= static_cast<int64_t>(indices_.size())
              ? indices_.end()
              : first + options_.batch_size_;
      item.batch = fetch_(std::vector<int64_t>(first, last));
    } catch (...) {
      item.error = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(
        lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.queue_depth_; });
    if (stop_) return;
    const bool failed = item.error != nullptr;
    queue_.push_back(std::move(item));
    changed_.notify_all();
    if (failed) return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(Item{});  // end marker
  changed_.notify_all();
}

std::optional<Batch> PrefetchLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_) return std::nullopt;
  if (!changed_.wait_until(lock, deadline_after(options_.timeout_),
                           [&] { return !queue_.empty(); })) {
    throw TimeoutError(
        fmt::format("PrefetchLoader: no batch within {} ms (batch size {}, {} "
                    "batches); the dataset's fetch is stuck or too slow",
                    options_.timeout_.count(), options_.batch_size_, num_batches_));
  }
  Item item = std::move(queue_.front());
  queue_.pop_front();
  changed_.notify_all();
  if (item.error) {
    finished_ = true;
    std::rethrow_exception(item.error);
  }
  if (!item.batch) finished_ = true;
  return std::move(item.batch);
}

}  // namespace ddp
