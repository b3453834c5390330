#pragma once
// How long since a start, in whole milliseconds: what the store client's messages quote as
// "after N ms" / "within N ms". Private to src/store.

#include <chrono>

#include "ddp/util/socket.hpp"

namespace ddp {

inline std::chrono::milliseconds elapsed_since(net::Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(net::Clock::now() - start);
}

}  // namespace ddp
