#include "call_info.hpp"

#include <fmt/format.h>

namespace ddp::detail {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kAllGatherV:
      return "all_gather_v";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
  }
  return "unknown-op";
}

std::string CallInfo::describe() const {
  if (kind == OpKind::kBarrier) return fmt::format("barrier() #{}", seq);
  std::string s = fmt::format("{}({}, count={}", to_string(kind), to_string(dtype), count);
  if (has_op) s += fmt::format(", {}", to_string(op));
  if (kind == OpKind::kSend) {
    s += fmt::format(", dst={}, tag={})", root, tag);
    return s;
  }
  if (kind == OpKind::kRecv) {
    s += fmt::format(", src={}, tag={})", root, tag);
    return s;
  }
  if (root >= 0) s += fmt::format(", root={}", root);
  return s + fmt::format(") #{}", seq);
}

bool CallInfo::matches(const CallInfo& o) const {
  // all_gather_v legitimately has different counts per rank.
  const bool count_ok = kind == OpKind::kAllGatherV || count == o.count;
  return kind == o.kind && dtype == o.dtype && has_op == o.has_op && (!has_op || op == o.op) &&
         root == o.root && count_ok && seq == o.seq;
}

}  // namespace ddp::detail
