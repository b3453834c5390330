#pragma once
// PrefetchLoader: cuts a sampler's index list into batches and assembles them on a background
// thread, so the next batch is ready while the current one trains (DataLoader with one
// worker thread instead of worker processes).
//
// Contract:
// - Batches come in index order: batch k holds indices[k*B, (k+1)*B). The last, short batch
//   is kept unless drop_last (DataLoader's default is to keep it).
// - At most queue_depth assembled batches wait in memory; the producer blocks beyond that.
// - An exception thrown while assembling batch k reaches the consumer from next() after
//   batches 0..k-1, and the producer stops.
// - The destructor stops the producer and joins it, also when batches remain unread.
// - next() waits at most `timeout` for a batch and then throws TimeoutError.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ddp/torch/data/tensor_dataset.hpp"

namespace ddp {

struct PrefetchLoaderOptions {
  static constexpr int64_t kBatchSize = 32;
  static constexpr bool kDropLast = false;
  static constexpr int64_t kQueueDepth = 2;
  static constexpr std::chrono::milliseconds kTimeout{std::chrono::minutes(5)};

  PrefetchLoaderOptions& batch_size(int64_t v) {
    batch_size_ = v;
    return *this;
  }
  PrefetchLoaderOptions& drop_last(bool v) {
    drop_last_ = v;
    return *this;
  }
  PrefetchLoaderOptions& queue_depth(int64_t v) {
    queue_depth_ = v;
    return *this;
  }
  PrefetchLoaderOptions& timeout(std::chrono::milliseconds v) {
    timeout_ = v;
    return *this;
  }

  int64_t batch_size_ = kBatchSize;
  bool drop_last_ = kDropLast;
  int64_t queue_depth_ = kQueueDepth;
  std::chrono::milliseconds timeout_ = kTimeout;
};

class PrefetchLoader {
 public:
  using Fetch = std::function<Batch(const std::vector<int64_t>& indices)>;

  // Starts the producer thread. Throws UsageError for batch_size < 1 or queue_depth < 1.
  PrefetchLoader(Fetch fetch, std::vector<int64_t> indices,
                 PrefetchLoaderOptions options = PrefetchLoaderOptions());
  // Batches of `dataset`, which must outlive the loader.
  PrefetchLoader(const TensorDataset& dataset, std::vector<int64_t> indices,
                 PrefetchLoaderOptions options = PrefetchLoaderOptions());
  ~PrefetchLoader();

  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  // len(DataLoader): the number of batches next() yields in all.
  int64_t num_batches() const { return num_batches_; }

  // The next batch, or nullopt after the last one.
  std::optional<Batch> next();

 private:
  struct Item {
    std::optional<Batch> batch;  // empty: end of data
    std::exception_ptr error;    // set: the producer failed assembling this batch
  };

  void produce();

  Fetch fetch_;
  std::vector<int64_t> indices_;
  PrefetchLoaderOptions options_;
  int64_t num_batches_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  bool stop_ = false;      // the consumer is going away
  bool finished_ = false;  // the consumer has seen the end or an error
  std::thread producer_;
};

}  // namespace ddp
