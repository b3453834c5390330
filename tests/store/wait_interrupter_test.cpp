// WaitInterrupter: interrupt() wakes every registered waiter, is sticky until clear(), and a
// registration that ended is never called.
#include <gtest/gtest.h>

#include <atomic>

#include "ddp/store/wait_interrupter.hpp"

namespace ddp {
namespace {

TEST(WaitInterrupter, InterruptCallsEveryRegisteredWake) {
  WaitInterrupter interrupter;
  int a = 0, b = 0;
  auto ra = interrupter.on_interrupt([&] { ++a; });
  auto rb = interrupter.on_interrupt([&] { ++b; });
  EXPECT_FALSE(interrupter.interrupted());
  interrupter.interrupt();
  EXPECT_TRUE(interrupter.interrupted());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 1);
}

TEST(WaitInterrupter, StaysInterruptedUntilClearedAndWakesALateRegistrationAtOnce) {
  WaitInterrupter interrupter;
  interrupter.interrupt();
  int woken = 0;
  {
    // A wait that starts after the interrupt must end at once: no lost wake-up.
    auto r = interrupter.on_interrupt([&] { ++woken; });
    EXPECT_EQ(woken, 1);
  }
  EXPECT_TRUE(interrupter.interrupted());
  interrupter.clear();
  EXPECT_FALSE(interrupter.interrupted());
  auto r = interrupter.on_interrupt([&] { ++woken; });
  EXPECT_EQ(woken, 1);
}

TEST(WaitInterrupter, AnEndedRegistrationIsNotCalled) {
  WaitInterrupter interrupter;
  int woken = 0;
  {
    auto r = interrupter.on_interrupt([&] { ++woken; });
    auto moved = std::move(r);  // the moved-from registration unregisters nothing
  }
  interrupter.interrupt();
  EXPECT_EQ(woken, 0);
}

}  // namespace
}  // namespace ddp
