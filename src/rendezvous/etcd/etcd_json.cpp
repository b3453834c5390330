#include "etcd_json.hpp"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "ddp/util/error.hpp"

namespace ddp::rdzv::etcd {

std::string base64_encode(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string base64_decode(const std::string& text, const std::string& context) {
  auto bad = [&] {
    return ProtocolError(
        fmt::format("{}: '{}' is not base64 (etcd's JSON gateway encodes keys and values so)",
                    context, quote_start(text, 40)));
  };
  if (text.empty()) return "";
  // Standard base64 as Go's encoding/base64 writes it: groups of 4 of the 64 letters, with
  // '=' padding (at most 2) only at the very end. EVP_DecodeBlock alone would also take
  // whitespace and '=' elsewhere, and then miscount the padding.
  if (text.size() % 4 != 0) throw bad();
  size_t pad = 0;
  while (pad < text.size() && text[text.size() - 1 - pad] == '=') ++pad;
  if (pad > 2) throw bad();
  for (size_t i = 0; i + pad < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (!(std::isalnum(c) && c < 0x80) && c != '+' && c != '/') throw bad();
  }
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0 || static_cast<size_t>(n) != out.size()) throw bad();
  // EVP_DecodeBlock counts the bytes '=' padding stands for; drop them.
  out.resize(out.size() - pad);
  return out;
}

std::string quote_start(const std::string& text, size_t limit) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < limit; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > limit) out += "...";
  return out;
}

Json parse_reply(const std::string& body, const std::string& context) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw ProtocolError(fmt::format(
        "{} answered something that is not etcd's v3 JSON API: '{}'. Is the endpoint an etcd "
        "(3.4 or later) client URL? --rdzv-endpoint takes etcd's client port (2379 by default, "
        "not the peer port 2380)",
        context, body.empty() ? std::string("(empty reply)") : quote_start(body)));
  }
  return j;
}

int64_t int_field(const Json& object, const char* name, const std::string& context,
                  int64_t fallback) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return fallback;
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) return it->get<int64_t>();
  } else if (it->is_number_integer()) {
    return it->get<int64_t>();
  } else if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    // No leading space or '+' (Go's strconv writes neither), nothing after, no overflow.
    if (!s.empty() && (s[0] == '-' || std::isdigit(static_cast<unsigned char>(s[0]))) &&
        *end == '\0' && errno != ERANGE) {
      return v;
    }
  }
  throw ProtocolError(fmt::format("{}: field '{}' holds {}, expected an integer (signed 64-bit)",
                                  context, name, quote_start(it->dump(), 60)));
}

namespace {

const Json& object_field(const Json& object, const char* name, const std::string& context) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_object()) {
    throw ProtocolError(fmt::format("{}: the reply has no '{}' object: '{}'", context, name,
                                    quote_start(object.dump())));
  }
  return *it;
}

std::string string_field(const Json& object, const char* name, const std::string& context) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return "";
  if (!it->is_string()) {
    throw ProtocolError(fmt::format("{}: field '{}' is not a string", context, name));
  }
  return it->get<std::string>();
}

bool bool_field(const Json& object, const char* name, const std::string& context) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return false;
  if (!it->is_boolean()) {
    throw ProtocolError(fmt::format("{}: field '{}' is not a boolean", context, name));
  }
  return it->get<bool>();
}

// The string at `name`, else `fallback` (for error bodies, which are reported, not trusted).
std::string text_or(const Json& object, const char* name, const std::string& fallback) {
  auto it = object.find(name);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

KeyValue parse_kv(const Json& kv, const std::string& context) {
  if (!kv.is_object())
    throw ProtocolError(fmt::format("{}: a key-value is not an object", context));
  KeyValue out;
  out.key = base64_decode(string_field(kv, "key", context), context);
  out.value = base64_decode(string_field(kv, "value", context), context);
  out.create_revision = int_field(kv, "create_revision", context);
  out.mod_revision = int_field(kv, "mod_revision", context);
  out.version = int_field(kv, "version", context);
  return out;
}

std::string range_end_of_prefix(std::string prefix) {
  // The smallest key greater than every key starting with prefix (etcd's clientv3 rule).
  while (!prefix.empty()) {
    unsigned char last = static_cast<unsigned char>(prefix.back());
    if (last < 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace

RangeReply parse_range(const Json& reply, const std::string& context) {
  RangeReply out;
  out.revision = int_field(object_field(reply, "header", context), "revision", context);
  auto it = reply.find("kvs");
  if (it != reply.end() && !it->is_null()) {
    if (!it->is_array()) throw ProtocolError(fmt::format("{}: 'kvs' is not an array", context));
    for (const auto& kv : *it) out.kvs.push_back(parse_kv(kv, context));
  }
  out.count = int_field(reply, "count", context, static_cast<int64_t>(out.kvs.size()));
  return out;
}

namespace {

// The responses of a txn (or of a nested one, whose reply has no header of its own).
void parse_txn_responses(const Json& reply, TxnReply& out, const std::string& context) {
  auto s = reply.find("succeeded");
  out.succeeded = s != reply.end() && s->is_boolean() && s->get<bool>();
  auto it = reply.find("responses");
  if (it == reply.end() || it->is_null()) return;
  if (!it->is_array()) throw ProtocolError(fmt::format("{}: 'responses' is not an array", context));
  for (const auto& r : *it) {
    if (auto put = r.find("response_put"); put != r.end()) {
      auto prev = put->find("prev_kv");
      out.put_prev.push_back(prev != put->end() && prev->is_object()
                                 ? std::optional<KeyValue>(parse_kv(*prev, context))
                                 : std::nullopt);
      continue;
    }
    if (auto nested = r.find("response_txn"); nested != r.end()) {
      if (!nested->is_object()) {
        throw ProtocolError(fmt::format("{}: 'response_txn' is not an object", context));
      }
      TxnReply inner;
      inner.revision = out.revision;
      parse_txn_responses(*nested, inner, context);
      out.txns.push_back(std::move(inner));
      continue;
    }
    auto range = r.find("response_range");
    if (range == r.end()) continue;
    RangeReply rr;
    rr.revision = out.revision;
    auto kvs = range->find("kvs");
    if (kvs != range->end() && kvs->is_array()) {
      for (const auto& kv : *kvs) rr.kvs.push_back(parse_kv(kv, context));
    }
    rr.count = int_field(*range, "count", context, static_cast<int64_t>(rr.kvs.size()));
    out.ranges.push_back(std::move(rr));
  }
}

}  // namespace

TxnReply parse_txn(const Json& reply, const std::string& context) {
  TxnReply out;
  out.revision = int_field(object_field(reply, "header", context), "revision", context);
  parse_txn_responses(reply, out, context);
  return out;
}

WatchMessage parse_watch_message(const std::string& line, const std::string& context) {
  Json j = parse_reply(line, context);
  if (auto e = j.find("error"); e != j.end()) {
    std::string message = e->is_object() ? text_or(*e, "message", e->dump()) : e->dump();
    WatchMessage m;
    m.canceled = true;
    m.cancel_reason = message;
    return m;
  }
  const Json& r = object_field(j, "result", context);
  WatchMessage m;
  m.created = bool_field(r, "created", context);
  m.canceled = bool_field(r, "canceled", context);
  m.cancel_reason = string_field(r, "cancel_reason", context);
  m.compact_revision = int_field(r, "compact_revision", context);
  auto events = r.find("events");
  if (events != r.end() && events->is_array()) {
    for (const auto& ev : *events) {
      // PUT is the default event type, so the gateway omits it.
      if (!ev.contains("type") || ev["type"] == "PUT") ++m.put_events;
    }
  }
  return m;
}

std::optional<ErrorReply> parse_error(const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return parse_error_object(j);
}

std::optional<int64_t> parse_int64(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long n = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return static_cast<int64_t>(n);
}

std::optional<ErrorReply> parse_error_object(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  // A streaming call's error (the lease keepalive's, a watch's):
  // {"error": {"grpc_code": 14, "http_code": 503, "message": "...", "http_status": "..."}}.
  if (auto nested = j.find("error"); nested != j.end() && nested->is_object()) {
    auto grpc_code = nested->find("grpc_code");
    if (grpc_code == nested->end() || !grpc_code->is_number_integer()) return std::nullopt;
    ErrorReply e;
    e.code = grpc_code->get<int>();
    e.message = text_or(*nested, "message", "(no message)");
    return e;
  }
  auto code = j.find("code");
  if (code == j.end() || !code->is_number_integer()) return std::nullopt;
  ErrorReply e;
  e.code = code->get<int>();
  e.message = text_or(j, "message", text_or(j, "error", "(no message)"));
  return e;
}

Json range_op(const std::string& key) {
  return {{"key", base64_encode(key)}};
}

Json range_at_op(const std::string& key, int64_t revision) {
  return {{"key", base64_encode(key)}, {"revision", std::to_string(revision)}};
}

Json prefix_count_op(const std::string& prefix, int64_t max_create_revision) {
  Json j = {{"key", base64_encode(prefix)},
            {"range_end", base64_encode(range_end_of_prefix(prefix))},
            {"count_only", true}};
  // As of that revision: etcd counts before applying max_create_revision, so that filter
  // would not narrow a count-only range.
  if (max_create_revision > 0) j["revision"] = std::to_string(max_create_revision);
  return j;
}

Json put_op(const std::string& key, const std::string& value, int64_t lease, bool prev_kv) {
  Json j = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  if (prev_kv) j["prev_kv"] = true;
  return j;
}

Json touch_op(const std::string& key) {
  return {{"key", base64_encode(key)},
          {"ignore_value", true},
          {"ignore_lease", true},
          {"prev_kv", true}};
}

Json compare_value(const std::string& key, const std::string& value) {
  return {{"key", base64_encode(key)},
          {"target", "VALUE"},
          {"result", "EQUAL"},
          {"value", base64_encode(value)}};
}

Json compare_absent(const std::string& key) {
  return {{"key", base64_encode(key)},
          {"target", "CREATE"},
          {"result", "EQUAL"},
          {"create_revision", "0"}};
}

Json compare_mod_revision(const std::string& key, int64_t revision) {
  return {{"key", base64_encode(key)},
          {"target", "MOD"},
          {"result", "EQUAL"},
          {"mod_revision", std::to_string(revision)}};
}

Json compare_value_less(const std::string& key, const std::string& value) {
  return {{"key", base64_encode(key)},
          {"target", "VALUE"},
          {"result", "LESS"},
          {"value", base64_encode(value)}};
}

Json compare_value_greater(const std::string& key, const std::string& value) {
  return {{"key", base64_encode(key)},
          {"target", "VALUE"},
          {"result", "GREATER"},
          {"value", base64_encode(value)}};
}

Json txn(Json compare, Json success, Json failure) {
  return {{"compare", std::move(compare)},
          {"success", std::move(success)},
          {"failure", std::move(failure)}};
}

Json watch_create(const std::string& key, int64_t start_revision) {
  return {{"create_request",
           {{"key", base64_encode(key)}, {"start_revision", std::to_string(start_revision)}}}};
}

}  // namespace ddp::rdzv::etcd
