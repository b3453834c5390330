#pragma once
// Checks on a request's fields shared by the store server's handlers (private to src/store).

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ddp/store/protocol.hpp"

namespace ddp::request_fields {

// Thrown by handlers for a well-framed request whose fields are wrong; closes the connection.
struct BadRequest {
  std::string message;
};

inline void expect_fields(const store_protocol::Frame& frame, size_t count) {
  if (frame.fields.size() != count) {
    throw BadRequest{fmt::format("{} needs {} fields, got {}", store_protocol::op_name(frame.op),
                                 count, frame.fields.size())};
  }
}

inline void expect_min_fields(const store_protocol::Frame& frame, size_t count) {
  if (frame.fields.size() < count) {
    throw BadRequest{fmt::format("{} needs at least {} fields, got {}",
                                 store_protocol::op_name(frame.op), count, frame.fields.size())};
  }
}

inline int64_t field_i64(const std::string& field, const char* what) {
  if (field.size() != 8) {
    throw BadRequest{
        fmt::format("field '{}' must be an 8-byte integer, got {} bytes", what, field.size())};
  }
  return store_protocol::decode_i64(field, what);
}

// Parses a value written by add(); nullopt if it is not a plain decimal integer.
inline std::optional<int64_t> parse_counter(const std::string& text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size()) return std::nullopt;
  int64_t value = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    int digit = text[i] - '0';
    if (__builtin_mul_overflow(value, 10, &value)) return std::nullopt;
    if (__builtin_add_overflow(value, text[0] == '-' ? -digit : digit, &value)) {
      return std::nullopt;
    }
  }
  return value;
}

}  // namespace ddp::request_fields
