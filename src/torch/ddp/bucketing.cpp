#include "ddp/torch/ddp/bucketing.hpp"

#include <algorithm>
#include <map>
#include <numeric>

namespace ddp {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params,
                                                const std::vector<size_t>& order,
                                                size_t first_bucket_cap, size_t bucket_cap) {
  struct Open {
    std::vector<size_t> members;
    size_t bytes = 0;
  };
  std::vector<size_t> position(params.size());
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  std::vector<std::vector<size_t>> closed;
  std::map<std::string, Open> open;  // one open bucket per dtype/device group
  for (size_t i : order) {
    Open& bucket = open[params[i].group];
    bucket.members.push_back(i);
    bucket.bytes += params[i].bytes;
    const size_t cap = closed.empty() ? first_bucket_cap : bucket_cap;
    if (bucket.bytes >= cap) {
      closed.push_back(std::move(bucket.members));
      bucket = Open{};
    }
  }
  // Leftovers, ordered by their first member (the one backward reaches first).
  std::vector<std::vector<size_t>> rest;
  for (auto& [group, bucket] : open) {
    if (!bucket.members.empty()) rest.push_back(std::move(bucket.members));
  }
  std::sort(rest.begin(), rest.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  for (auto& r : rest) closed.push_back(std::move(r));
  return closed;
}

std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params,
                                                size_t first_bucket_cap, size_t bucket_cap) {
  std::vector<size_t> reverse(params.size());
  std::iota(reverse.rbegin(), reverse.rend(), size_t{0});
  return assign_buckets(params, reverse, first_bucket_cap, bucket_cap);
}

}  // namespace ddp
