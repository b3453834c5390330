// FutureWork and the saturating deadline helpers it relies on: "no limit" is
// std::chrono::milliseconds::max(), which must wait (not overflow into an instant timeout or
// undefined behaviour).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "future_work.hpp"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

TEST(DeadlineTest, HugeTimeoutsClampInsteadOfOverflowing) {
  auto now = std::chrono::steady_clock::now();
  EXPECT_EQ(deadline_after(Ms::max(), now), now + kMaxWait);
  EXPECT_EQ(deadline_after(std::chrono::seconds::max(), now), now + kMaxWait);
  EXPECT_EQ(deadline_after(std::chrono::nanoseconds::max(), now), now + kMaxWait);
  EXPECT_EQ(deadline_after(std::chrono::hours::max(), now), now + kMaxWait);
  EXPECT_EQ(deadline_after(std::chrono::duration<int32_t, std::milli>::max(), now),
            now + Ms{INT32_MAX});
  EXPECT_EQ(deadline_after(std::chrono::duration<double>(1e300), now), now + kMaxWait);
  EXPECT_EQ(deadline_after(Ms::min(), now), now);
  EXPECT_EQ(deadline_after(Ms{-5}, now), now);
  EXPECT_EQ(deadline_after(Ms{250}, now), now + Ms{250});
  EXPECT_EQ(deadline_after(std::chrono::microseconds{1500}, now), now + Ms{2});
  EXPECT_EQ(saturating_add(Ms::max(), Ms{5000}), kMaxWait);
  EXPECT_EQ(saturating_add(Ms{1000}, Ms{5000}), Ms{6000});
}

TEST(FutureWorkTest, WaitWithoutLimitCompletes) {
  detail::FutureWork work("test op");
  std::thread finisher([&] {
    std::this_thread::sleep_for(50ms);
    work.finish(nullptr);
  });
  EXPECT_NO_THROW(work.wait(Ms::max()));
  finisher.join();
  EXPECT_TRUE(work.is_completed());
}

TEST(FutureWorkTest, WaitWithoutLimitRethrowsTheError) {
  detail::FutureWork work("test op");
  std::thread finisher(
      [&] { work.finish(std::make_exception_ptr(CollectiveError("peer rank 1 failed"))); });
  EXPECT_THROW(work.wait(Ms::max()), CollectiveError);
  finisher.join();
}

TEST(FutureWorkTest, ShortLimitStillTimesOutNamingTheOperation) {
  detail::FutureWork work("all_reduce #7");
  try {
    work.wait(Ms{1});
    FAIL() << "an unfinished work completed";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce #7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::test
