#pragma once
// Conversions between ddp's stores (values are std::string) and c10d's (std::vector<uint8_t>),
// for the adapters in both directions (store_bridge.hpp, job_store.hpp).

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::python {

inline std::vector<uint8_t> to_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

inline std::string to_string(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

}  // namespace ddp::python
