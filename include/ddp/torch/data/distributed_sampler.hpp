#pragma once
// DistributedSampler: which dataset indices this rank visits in an epoch, with exactly the
// order of PyTorch's torch.utils.data.distributed.DistributedSampler (1.13 and 2.x):
//
//   shuffle:   indices = torch.randperm(N, generator=g) with g.manual_seed(seed + epoch)
//              (CPU mt19937 generator; same kernel in C++ and Python, int64 result)
//   otherwise: indices = 0 .. N-1
//   not drop_last: pad to total_size by repeating the head of `indices` (cycled as often as
//              needed when the padding is longer than N)
//   drop_last: truncate to total_size
//   this rank: indices[rank : total_size : num_replicas]
//
// num_samples = ceil((N - R) / R) when drop_last and N % R != 0, else ceil(N / R);
// total_size = num_samples * R. Every rank gets num_samples indices, so ranks take the same
// number of steps (DDP needs that: a rank with one step more would wait in all-reduce).

#include <cstdint>
#include <vector>

namespace ddp {

struct DistributedSamplerOptions {
  static constexpr bool kShuffle = true;
  static constexpr uint64_t kSeed = 0;
  static constexpr bool kDropLast = false;

  DistributedSamplerOptions(int64_t num_replicas, int64_t rank)
      : num_replicas_(num_replicas), rank_(rank) {}

  DistributedSamplerOptions& shuffle(bool v) {
    shuffle_ = v;
    return *this;
  }
  DistributedSamplerOptions& seed(uint64_t v) {
    seed_ = v;
    return *this;
  }
  DistributedSamplerOptions& drop_last(bool v) {
    drop_last_ = v;
    return *this;
  }

  int64_t num_replicas_;
  int64_t rank_;
  bool shuffle_ = kShuffle;
  uint64_t seed_ = kSeed;
  bool drop_last_ = kDropLast;
};

class DistributedSampler {
 public:
  // Throws UsageError when rank is outside [0, num_replicas), num_replicas < 1 or size < 0.
  // Like PyTorch, drop_last with size < num_replicas gives every rank zero samples.
  DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options);

  // Like PyTorch's set_epoch: call before each epoch so shuffling differs between epochs and
  // is identical on every rank.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch, in visiting order; num_samples() of them.
  std::vector<int64_t> indices() const;

  int64_t num_samples() const { return num_samples_; }  // len(sampler)
  int64_t total_size() const { return total_size_; }
  int64_t dataset_size() const { return dataset_size_; }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t total_size_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace ddp
