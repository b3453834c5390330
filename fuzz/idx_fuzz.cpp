// libFuzzer target for the IDX parser (ddp::parse_idx), which reads dataset files from disk.
// Properties checked on every input:
// - parsing never crashes, reads out of bounds or allocates past max_elements (ASan);
// - malformed input is reported only as ddp::UsageError;
// - an accepted array is self-consistent: element count x element size == data bytes, and the
//   header plus data account for the whole input (trailing bytes are an error).
#include <cstddef>
#include <cstdint>

#include "ddp/torch/data/idx_format.hpp"
#include "ddp/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kMaxElements = int64_t{1} << 20;
  try {
    ddp::IdxArray array = ddp::parse_idx(data, size, "fuzz input", kMaxElements);
    size_t element = ddp::idx_element_size(array.type_code);
    if (element == 0 || array.numel() > kMaxElements) __builtin_trap();
    if (static_cast<size_t>(array.numel()) * element != array.data.size()) __builtin_trap();
    if (4 + 4 * array.dims.size() + array.data.size() != size) __builtin_trap();
  } catch (const ddp::UsageError&) {
    // The documented outcome for malformed files.
  }
  return 0;
}
