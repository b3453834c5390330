// libFuzzer target for the pickle reader under DCP checkpoints (ddp::pickle::parse) and the
// `.metadata` decoder on top of it (ddp::dcp::decode): both read files from a checkpoint
// directory, which may be truncated, corrupted or written by someone else.
// Properties checked on every input:
// - parsing never crashes, recurses without bound (a 2,000-deep "((((l" stream), loops on a
//   container that holds itself through the memo, or reads out of bounds (ASan);
// - malformed input is reported only as ddp::UsageError;
// - a parsed document has a root that belongs to its arena.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dcp_metadata.hpp"
#include "ddp/util/error.hpp"
#include "pickle_object.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ddp::pickle::Document doc = ddp::pickle::parse(data, size, "fuzz input");
    bool owned = false;
    for (const auto& o : doc.arena) owned = owned || o.get() == doc.root;
    if (!owned) __builtin_trap();
  } catch (const ddp::UsageError&) {
    // The documented outcome for malformed files.
  }
  try {
    (void)ddp::dcp::decode(std::string(reinterpret_cast<const char*>(data), size), "fuzz input");
  } catch (const ddp::UsageError&) {
  }
  return 0;
}
