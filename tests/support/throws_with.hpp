#pragma once
// throws_with<E>(call, {fragments...}): a gtest predicate that passes when `call` throws an E
// whose message contains every fragment; it fails naming the missing fragment, a wrong
// exception type, or that nothing was thrown.

#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <string>

namespace ddp::test {

template <class E, class F>
::testing::AssertionResult throws_with(F call, std::initializer_list<const char*> fragments) {
  try {
    call();
  } catch (const E& e) {
    const std::string message = e.what();
    for (const char* fragment : fragments) {
      if (message.find(fragment) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks \"" << fragment << "\": " << message;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception type: " << e.what();
  }
  return ::testing::AssertionFailure() << "nothing was thrown";
}

}  // namespace ddp::test
