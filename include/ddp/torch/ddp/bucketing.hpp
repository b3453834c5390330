#pragma once
// Bucket assignment: which parameters' gradients travel together in one all-reduce.
//
// Parameters are taken in the order backward is expected to produce their gradients: at
// construction REVERSE registration order (the usual order), after the first backward the
// order observed on rank 0 (the Reducer rebuilds its buckets once, as PyTorch does). They are
// grouped by dtype and device (a bucket is one flat tensor). A bucket is closed once its size
// reaches its cap: the first bucket's cap is small (default 1 MB) so communication starts early
// in backward, later buckets use bucket_cap (default 25 MB). The result depends only on the
// inputs, so every rank given the same inputs computes the same assignment.

#include <cstddef>
#include <string>
#include <vector>

namespace ddp {

struct BucketParam {
  size_t bytes = 0;
  std::string group;  // dtype + device; only parameters of one group share a bucket
};

// Returns buckets (lists of indices into params) in launch order, taking the parameters in
// `order` (a permutation of 0..params.size()-1). Caps are in bytes.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params,
                                                const std::vector<size_t>& order,
                                                size_t first_bucket_cap, size_t bucket_cap);

// The same, in reverse registration order.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params,
                                                size_t first_bucket_cap, size_t bucket_cap);

}  // namespace ddp
