#include "ddp/store/protocol.hpp"

#include <fmt/format.h>

#include <cstring>

#include "ddp/util/error.hpp"

namespace ddp::store_protocol {

namespace {

uint32_t load_u32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

void append_u32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

ParseResult error_result(std::string message, uint32_t request_id = 0) {
  ParseResult result;
  result.status = ParseStatus::kError;
  result.error = std::move(message);
  result.request_id = request_id;
  return result;
}

}  // namespace

ParseResult parse_frame(const uint8_t* data, size_t size, size_t max_frame_bytes) {
  ParseResult result;
  if (size == 0) return result;
  // The magic is checked byte by byte as it arrives so garbage is rejected at once.
  size_t magic_bytes = size < sizeof(kMagic) ? size : sizeof(kMagic);
  if (std::memcmp(data, kMagic, magic_bytes) != 0) {
    return error_result(
        "bad magic: the peer does not speak the ddp store protocol (is it a ddp TcpStore "
        "client? PyTorch's TCPStore and other protocols are not understood)");
  }
  if (size < kHeaderBytes) return result;

  uint8_t version = data[4];
  uint32_t request_id = load_u32(data + 8);
  if (version != kVersion) {
    return error_result(fmt::format("protocol version {} is not supported (this side speaks "
                                    "version {}); run the same ddp version on every host",
                                    version, kVersion),
                        request_id);
  }
  uint32_t payload_bytes = load_u32(data + 12);
  if (kHeaderBytes + uint64_t{payload_bytes} > max_frame_bytes) {
    return error_result(fmt::format("frame of {} bytes exceeds the limit of {} bytes; raise "
                                    "max_frame_bytes on both sides or send smaller values",
                                    kHeaderBytes + uint64_t{payload_bytes}, max_frame_bytes),
                        request_id);
  }
  if (payload_bytes < 4) {
    return error_result(
        fmt::format("payload of {} bytes is too short to hold a field count", payload_bytes),
        request_id);
  }
  if (size < kHeaderBytes + payload_bytes) return result;

  const uint8_t* p = data + kHeaderBytes;
  const uint8_t* end = p + payload_bytes;
  uint32_t count = load_u32(p);
  p += 4;
  // Every field needs at least its 4-byte length, which bounds the count before reserving.
  if (count > static_cast<size_t>(end - p) / 4) {
    return error_result(
        fmt::format("field count {} does not fit in a payload of {} bytes", count, payload_bytes),
        request_id);
  }
  if (count > kMaxFieldsPerFrame) {
    return error_result(fmt::format("field count {} exceeds the limit of {} fields a frame; send "
                                    "fewer keys or values a request",
                                    count, kMaxFieldsPerFrame),
                        request_id);
  }
  Frame& frame = result.frame;
  frame.fields.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (end - p < 4) {
      return error_result(fmt::format("field {} of {} is truncated", i, count), request_id);
    }
    uint32_t length = load_u32(p);
    p += 4;
    if (length > static_cast<size_t>(end - p)) {
      return error_result(fmt::format("field {} of {} claims {} bytes but only {} remain", i, count,
                                      length, end - p),
                          request_id);
    }
    frame.fields.emplace_back(reinterpret_cast<const char*>(p), length);
    p += length;
  }
  if (p != end) {
    return error_result(
        fmt::format("{} trailing bytes after the last field of the payload", end - p), request_id);
  }
  frame.version = version;
  frame.op = static_cast<Op>(data[5]);
  frame.flags = load_u16(data + 6);
  frame.request_id = request_id;
  result.status = ParseStatus::kComplete;
  result.consumed = kHeaderBytes + payload_bytes;
  result.request_id = request_id;
  return result;
}

uint64_t declared_frame_bytes(const uint8_t* data, size_t size) {
  if (size < kHeaderBytes) return 0;
  return kHeaderBytes + uint64_t{load_u32(data + 12)};
}

std::string encode_frame(const Frame& frame) {
  if (frame.fields.size() > kMaxFieldsPerFrame) {
    throw UsageError(fmt::format(
        "a store request of {} fields exceeds the limit of {} fields a request; split it into "
        "calls of fewer keys",
        frame.fields.size(), kMaxFieldsPerFrame));
  }
  uint64_t payload = 4;
  for (const auto& field : frame.fields) {
    if (field.size() > UINT32_MAX) {
      throw UsageError(
          fmt::format("a store value of {} bytes exceeds the 4 GiB field limit", field.size()));
    }
    payload += 4 + field.size();
  }
  if (payload > UINT32_MAX) {
    throw UsageError(
        fmt::format("a store request of {} bytes exceeds the 4 GiB frame limit", payload));
  }
  std::string out;
  out.reserve(kHeaderBytes + payload);
  out.append(kMagic, sizeof(kMagic));
  out.push_back(static_cast<char>(frame.version));
  out.push_back(static_cast<char>(frame.op));
  out.push_back(static_cast<char>(frame.flags & 0xFF));
  out.push_back(static_cast<char>(frame.flags >> 8));
  append_u32(out, frame.request_id);
  append_u32(out, static_cast<uint32_t>(payload));
  append_u32(out, static_cast<uint32_t>(frame.fields.size()));
  for (const auto& field : frame.fields) {
    append_u32(out, static_cast<uint32_t>(field.size()));
    out.append(field);
  }
  return out;
}

std::string encode_i64(int64_t value) {
  std::string out(8, '\0');
  auto bits = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((bits >> (8 * i)) & 0xFF);
  return out;
}

int64_t decode_i64(const std::string& field, const char* what) {
  if (field.size() != 8) {
    throw ProtocolError(
        fmt::format("field '{}' must be an 8-byte integer, got {} bytes", what, field.size()));
  }
  uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) bits |= uint64_t{static_cast<uint8_t>(field[i])} << (8 * i);
  return static_cast<int64_t>(bits);
}

bool is_write(Op op) {
  return op == Op::kSet || op == Op::kAdd || op == Op::kCompareSet || op == Op::kDelete ||
         op == Op::kMultiSet;
}

std::string op_name(Op op) {
  switch (op) {
    case Op::kHello:
      return "hello";
    case Op::kAuth:
      return "auth";
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kAdd:
      return "add";
    case Op::kCompareSet:
      return "compare_set";
    case Op::kDelete:
      return "delete_key";
    case Op::kNumKeys:
      return "num_keys";
    case Op::kCheck:
      return "check";
    case Op::kWait:
      return "wait";
    case Op::kMultiGet:
      return "multi_get";
    case Op::kMultiSet:
      return "multi_set";
    case Op::kCancelWait:
      return "cancel_wait";
    case Op::kPing:
      return "ping";
    case Op::kReplicate:
      return "replicate";
    case Op::kPromote:
      return "promote";
    case Op::kSnapshot:
      return "snapshot";
    case Op::kOk:
      return "ok";
    case Op::kChallenge:
      return "challenge";
    case Op::kTimeout:
      return "timeout";
    case Op::kError:
      return "error";
  }
  return fmt::format("op 0x{:02x}", static_cast<unsigned>(op));
}

}  // namespace ddp::store_protocol
