#pragma once
// etcd's v3 JSON gateway (https://etcd.io/docs/v3.4/dev-guide/api_grpc_gateway/): the request
// bodies ddp sends and the parsing of etcd's replies. Pure functions, so tests pin every
// malformed reply. Internal to src/rendezvous/etcd.
//
// The gateway writes keys and values as base64 and 64-bit integers as JSON strings ("12"),
// and omits fields that hold their default (false, 0, empty): an absent "succeeded" is a
// failed transaction, an absent "kvs" an empty range. Anything that is not such a reply is a
// ProtocolError naming `context` (the endpoint and request), so an endpoint that is not etcd
// is recognised at the first request.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddp::rdzv::etcd {

using Json = nlohmann::json;

std::string base64_encode(const std::string& bytes);
// Throws ProtocolError naming `context` when `text` is not base64.
std::string base64_decode(const std::string& text, const std::string& context);

// The body as JSON; ProtocolError quoting its start when it is not a JSON object.
Json parse_reply(const std::string& body, const std::string& context);

// An integer field written as a string or a number; `fallback` when absent.
int64_t int_field(const Json& object, const char* name, const std::string& context,
                  int64_t fallback = 0);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;  // puts since the key was created (1 after the first)
};

struct RangeReply {
  int64_t revision = 0;  // the store's revision when the range was read
  std::vector<KeyValue> kvs;
  int64_t count = 0;
};
RangeReply parse_range(const Json& reply, const std::string& context);

struct TxnReply {
  bool succeeded = false;
  int64_t revision = 0;
  // The response_range of each range operation of the branch that ran, in order.
  std::vector<RangeReply> ranges;
  // For each put operation of that branch, in order: the key's previous version when the put
  // asked for it (prev_kv) and the key existed.
  std::vector<std::optional<KeyValue>> put_prev;
  // The reply of each nested txn operation of that branch, in order (its revision: this one's).
  std::vector<TxnReply> txns;
};
TxnReply parse_txn(const Json& reply, const std::string& context);

// One message of a watch stream (one line: {"result": {...}} or {"error": {...}}).
struct WatchMessage {
  bool created = false;
  bool canceled = false;
  std::string cancel_reason;
  int64_t compact_revision = 0;
  int64_t put_events = 0;  // PUT events (DELETE events are not counted)
};
WatchMessage parse_watch_message(const std::string& line, const std::string& context);

// etcd's error body: {"error": "...", "code": <gRPC code>, "message": "..."}, or a streaming
// call's (lease keepalive, watch): {"error": {"grpc_code": <code>, "message": "...", ...}}.
struct ErrorReply {
  int code = 0;
  std::string message;
};
std::optional<ErrorReply> parse_error(const std::string& body);
// The same for a reply already parsed.
std::optional<ErrorReply> parse_error_object(const Json& reply);

// `text` as a whole decimal integer (a sign, digits, nothing else, no overflow); nullopt if not.
std::optional<int64_t> parse_int64(const std::string& text);

// gRPC codes the gateway reports that ddp treats specially.
constexpr int kGrpcNotFound = 5;      // "requested lease not found"
constexpr int kGrpcUnavailable = 14;  // no leader, leader changed, member stopping
constexpr int kGrpcUnauthenticated = 16;
constexpr int kGrpcPermissionDenied = 7;

// Request builders (keys and values raw; they are encoded here).
Json range_op(const std::string& key);
// The key as it was at `revision` (a read of the past; etcd refuses it once compacted).
Json range_at_op(const std::string& key, int64_t revision);
// Counts the keys under `prefix`; with max_create_revision > 0 those that existed at that
// revision (a read of the past: for keys never deleted, those created by then).
Json prefix_count_op(const std::string& prefix, int64_t max_create_revision = 0);
Json put_op(const std::string& key, const std::string& value, int64_t lease, bool prev_kv = false);
// A put that keeps the key's value and lease and only raises its version (etcd refuses it for
// an absent key), returning the previous key-value.
Json touch_op(const std::string& key);
// Compare: the key's value equals `value`.
Json compare_value(const std::string& key, const std::string& value);
// Compare: the key is absent (its create revision is 0).
Json compare_absent(const std::string& key);
// Compare: the key was last modified at `revision`.
Json compare_mod_revision(const std::string& key, int64_t revision);
// Compare: the key's value is less than `value` (bytewise; the key must exist).
Json compare_value_less(const std::string& key, const std::string& value);
// Compare: the key's value is greater than `value` (bytewise; the key must exist).
Json compare_value_greater(const std::string& key, const std::string& value);
// A txn body from compare, success and failure operations ({"request_range": ...} etc.).
Json txn(Json compare, Json success, Json failure);
Json watch_create(const std::string& key, int64_t start_revision);

// The first `limit` bytes of `text` with control characters escaped, for messages.
std::string quote_start(const std::string& text, size_t limit = 120);

}  // namespace ddp::rdzv::etcd
