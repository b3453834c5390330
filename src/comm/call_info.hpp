#pragma once
// CallInfo: what one collective call was (op, dtype, count, reduce op, root, sequence number).
// Used in error messages, Work timeouts and the debug-mode fingerprint comparison.

#include <cstddef>
#include <cstdint>
#include <string>

#include "ddp/comm/types.hpp"

namespace ddp::detail {

enum class OpKind : uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kAllGatherV,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kSend,
  kRecv,
};

const char* to_string(OpKind kind);

struct CallInfo {
  OpKind kind = OpKind::kBarrier;
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  bool has_op = false;
  int root = -1;       // root, dst or src; -1 when the op has none
  int tag = 0;         // send/recv only
  uint64_t count = 0;  // elements (all_gather_v: this rank's count)
  uint64_t seq = 0;    // per-group collective sequence number (send/recv: 0)
  size_t bytes = 0;    // payload this rank contributes, for scheduling decisions

  bool is_p2p() const { return kind == OpKind::kSend || kind == OpKind::kRecv; }
  // "all_reduce(float32, count=10, sum) #3"
  std::string describe() const;
  // Whether two ranks' calls are compatible (same op, dtype, count, reduce op, root).
  bool matches(const CallInfo& other) const;
};

}  // namespace ddp::detail
