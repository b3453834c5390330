// libFuzzer target for the store's frame parser (ddp::store_protocol::parse_frame), which
// reads bytes straight off the network. Properties checked on every input:
// - parsing never crashes, reads out of bounds, or allocates beyond the frame limit (ASan);
// - a complete frame consumes no more than the input and at most the frame limit;
// - a complete frame re-encodes to exactly the bytes it was parsed from (the format has one
//   encoding per frame);
// - every proper prefix of a complete frame is either "need more" or, for a bad header, the
//   same error as the whole frame; never "complete";
// - declared_frame_bytes (the server's pre-authentication size check) agrees with the size of
//   a complete frame.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ddp/store/protocol.hpp"

using ddp::store_protocol::encode_frame;
using ddp::store_protocol::parse_frame;
using ddp::store_protocol::ParseStatus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks a small frame limit sometimes, to exercise the size check.
  size_t limit = ddp::store_protocol::kDefaultMaxFrameBytes;
  if (size > 0 && data[0] < 16) limit = ddp::store_protocol::kHeaderBytes + data[0] * 8;
  auto result = parse_frame(data, size, limit);
  // Never reads past the input, whatever it holds.
  (void)ddp::store_protocol::declared_frame_bytes(data, size);
  if (result.status != ParseStatus::kComplete) return 0;
  if (result.consumed > size || result.consumed > limit) __builtin_trap();
  if (ddp::store_protocol::declared_frame_bytes(data, size) != result.consumed) __builtin_trap();
  std::string encoded = encode_frame(result.frame);
  if (encoded.size() != result.consumed || std::memcmp(encoded.data(), data, encoded.size()) != 0) {
    __builtin_trap();
  }
  for (size_t cut : {size_t{0}, result.consumed / 2, result.consumed - 1}) {
    if (cut >= result.consumed) continue;
    if (parse_frame(data, cut, limit).status == ParseStatus::kComplete) __builtin_trap();
  }
  return 0;
}
