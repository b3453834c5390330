// Bucket assignment: reverse or given order, caps, one dtype/device per bucket.
#include <gtest/gtest.h>

#include "ddp/torch/ddp/bucketing.hpp"

namespace {

using Buckets = std::vector<std::vector<size_t>>;

std::vector<ddp::BucketParam> of_sizes(std::vector<size_t> bytes) {
  std::vector<ddp::BucketParam> out;
  for (size_t b : bytes) out.push_back({b, "float@cpu"});
  return out;
}

TEST(Bucketing, ReverseOrderWithSmallFirstBucket) {
  // 4 params of 100 bytes: first cap 150 closes after 2 (200 >= 150), then cap 1000 takes the
  // rest.
  EXPECT_EQ(ddp::assign_buckets(of_sizes({100, 100, 100, 100}), 150, 1000),
            (Buckets{{3, 2}, {1, 0}}));
}

TEST(Bucketing, TinyCapGivesOneParameterPerBucket) {
  EXPECT_EQ(ddp::assign_buckets(of_sizes({8, 16, 4}), 1, 1), (Buckets{{2}, {1}, {0}}));
}

TEST(Bucketing, HugeCapGivesOneBucket) {
  EXPECT_EQ(ddp::assign_buckets(of_sizes({8, 16, 4}), 1 << 30, 1 << 30), (Buckets{{2, 1, 0}}));
}

TEST(Bucketing, DtypesNeverShareABucket) {
  std::vector<ddp::BucketParam> params = {
      {10, "float@cpu"}, {10, "double@cpu"}, {10, "float@cpu"}, {10, "double@cpu"}};
  auto buckets = ddp::assign_buckets(params, 1000, 1000);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{3, 1}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{2, 0}));
}

TEST(Bucketing, FollowsAnObservedOrder) {
  // The order of a rebuild: parameters in the given order, leftovers of each dtype ordered by
  // where their first member stands in it (float's 0 before double's 1 here, although reverse
  // registration order would put 1 first).
  std::vector<ddp::BucketParam> params = {
      {10, "float@cpu"}, {10, "double@cpu"}, {10, "float@cpu"}, {10, "float@cpu"}};
  EXPECT_EQ(ddp::assign_buckets(params, {2, 3, 0, 1}, 20, 1000), (Buckets{{2, 3}, {0}, {1}}));
}

TEST(Bucketing, EmptyModelHasNoBuckets) {
  EXPECT_TRUE(ddp::assign_buckets({}, 10, 10).empty());
}

}  // namespace
