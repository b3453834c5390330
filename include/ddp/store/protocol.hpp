#pragma once
// The TcpStore wire format (docs/store-protocol.md is the normative description).
//
// A frame is a 16-byte header followed by a payload:
//   magic "DDPS" (4 bytes) | version u8 | opcode u8 | flags u16 | request id u32 |
//   payload length u32
// and the payload is a field count u32 followed by that many fields, each a u32 length and
// that many bytes. All integers are little-endian. Integer values inside fields are 8-byte
// little-endian two's complement (encode_i64/decode_i64).
//
// parse_frame is a pure function over bytes (no I/O, no allocation beyond the result) so the
// server, the client and the fuzzer share one parser.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::store_protocol {

constexpr char kMagic[4] = {'D', 'D', 'P', 'S'};
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 16;
constexpr size_t kDefaultMaxFrameBytes = size_t{64} << 20;  // header + payload
// Fields (keys, values) in one frame. An empty field is 4 bytes on the wire but a whole
// std::string once parsed: without this cap a 64 MiB frame of empty fields became half a GiB.
constexpr size_t kMaxFieldsPerFrame = size_t{1} << 20;

enum class Op : uint8_t {
  // Handshake (the only requests accepted before authentication).
  kHello = 0x01,  // [client description]          -> kOk [] | kChallenge [nonce]
  kAuth = 0x02,   // [HMAC-SHA256(token, nonce)]    -> kOk [] | kError
  // Key-value operations.
  kSet = 0x10,         // [key, value]                -> kOk []
  kGet = 0x11,         // [key, timeout i64 ms]       -> kOk [value] | kTimeout [key]
  kAdd = 0x12,         // [key, delta i64]            -> kOk [result i64]
  kCompareSet = 0x13,  // [key, expected, desired]    -> kOk [value]
  kDelete = 0x14,      // [key]                       -> kOk [existed u8]
  kNumKeys = 0x15,     // []                          -> kOk [count i64]
  kCheck = 0x16,       // [key...]                    -> kOk [all set u8]
  kWait = 0x17,        // [timeout i64 ms, key...]    -> kOk [] | kTimeout [missing...]
  kMultiGet = 0x18,    // [timeout i64 ms, key...]    -> kOk [value...] | kTimeout [missing...]
  kMultiSet = 0x19,    // [key, value, key, value...] -> kOk []
  // Sent while a kWait of the same request id waits: that wait answers kTimeout at once.
  // No reply of its own (the only request a client may send before the previous reply).
  kCancelWait = 0x1A,  // []                          -> (none)
  kPing = 0x1F,        // []                          -> kOk []
  // Replication (docs/store-protocol.md, "Standby stores"). kReplicate is accepted only from a
  // primary's replication connection to a standby; inner_op is one write (set, add,
  // compare_set, delete_key, multi_set) or kSnapshot, and the reply is the inner op's.
  kReplicate = 0x1B,  // [client id, request id i64, inner_op u8, field...] -> inner op's reply
  // On a standby: start serving clients with the data replicated so far, stop taking the
  // replication stream, and replicate to the first of `next` that answers. On a store that
  // serves clients already: nothing (idempotent).
  kPromote = 0x1C,  // [next standby "host:port"...] -> kOk []
  // Only inside kReplicate: replace the whole data with these pairs (a new primary's copy).
  kSnapshot = 0x1D,  // [key, value, key, value...] -> kOk []
  // Replies.
  kOk = 0x80,
  kChallenge = 0x81,  // [nonce]
  kTimeout = 0x82,    // [missing key...]
  kError = 0x83,      // [kind, message]; kind is one of the kError* strings below
};

// Error kinds carried by kError replies; the client maps them to exception types.
constexpr const char* kErrorAuth = "auth";          // StoreError; connection closed
constexpr const char* kErrorProtocol = "protocol";  // ProtocolError; connection closed
constexpr const char* kErrorStore = "store";        // StoreError; connection stays open
constexpr const char* kErrorUsage = "usage";        // UsageError; connection stays open
// A standby store not promoted yet refuses clients at hello (the client tries another
// endpoint of its list); connection closed.
constexpr const char* kErrorStandby = "standby";

// Hello's first field names the peer's role. A client may add " id=<hex>": a standby then
// answers a write it re-sends (same id and request id) after a fail-over with the reply the
// write got, instead of applying it twice.
constexpr const char* kClientRole = "ddp-tcpstore-client";
constexpr const char* kReplicaRole = "ddp-tcpstore-replica";  // a primary's replication stream
constexpr const char* kAdminRole = "ddp-tcpstore-admin";      // promote (and ping) only

struct Frame {
  uint8_t version = kVersion;
  Op op = Op::kPing;
  uint16_t flags = 0;
  uint32_t request_id = 0;
  std::vector<std::string> fields;
};

enum class ParseStatus {
  kNeedMore,  // the bytes are a valid prefix of a frame; read more
  kComplete,  // `frame` holds a frame of `consumed` bytes
  kError,     // the bytes can never become a valid frame; `error` says why
};

struct ParseResult {
  ParseStatus status = ParseStatus::kNeedMore;
  size_t consumed = 0;
  Frame frame;
  std::string error;
  // The header's request id when the header was readable (to address an error reply).
  uint32_t request_id = 0;
};

// Parses the frame at the start of [data, data+size). Checks magic, version, the frame size
// limit (header + payload <= max_frame_bytes), and that the fields fill the payload exactly.
// Unknown opcodes parse fine (the server answers them with an error); versions other than
// kVersion are an error naming both versions.
ParseResult parse_frame(const uint8_t* data, size_t size,
                        size_t max_frame_bytes = kDefaultMaxFrameBytes);

// The frame size (header + payload) announced by a header at the start of [data, data+size),
// or 0 when fewer than kHeaderBytes are available.
uint64_t declared_frame_bytes(const uint8_t* data, size_t size);

// The encoded bytes of frame. Throws UsageError if a field exceeds 4 GiB or the frame has more
// than kMaxFieldsPerFrame fields.
std::string encode_frame(const Frame& frame);

// 8-byte little-endian integer fields.
std::string encode_i64(int64_t value);
// Throws ProtocolError if field is not 8 bytes; `what` names the field in the message.
int64_t decode_i64(const std::string& field, const char* what);

// Whether op changes the data (what a primary sends its standby).
bool is_write(Op op);

// A short name for an opcode ("set", "get", ...; "op 0x42" for unknown ones).
std::string op_name(Op op);

}  // namespace ddp::store_protocol
