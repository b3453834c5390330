// The etcd client's JSON side: encoding, etcd's replies as the v3 gateway writes them, and
// the ProtocolErrors of replies that are not etcd's.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../support/throws_with.hpp"
#include "ddp/util/error.hpp"
#include "etcd_counter.hpp"
#include "etcd_json.hpp"

namespace ddp::rdzv::etcd {
namespace {

using ddp::test::throws_with;

TEST(EtcdJson, Base64RoundTripsEveryLength) {
  std::string bytes;
  for (int n = 0; n < 10; ++n) {
    EXPECT_EQ(base64_decode(base64_encode(bytes), "t"), bytes) << n;
    bytes.push_back(static_cast<char>(n * 37));
  }
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_decode("YmFy", "t"), "bar");
  EXPECT_TRUE(
      throws_with<ProtocolError>([] { base64_decode("abc", "ctx"); }, {"ctx", "not base64"}));
  EXPECT_TRUE(throws_with<ProtocolError>([] { base64_decode("a*b=", "ctx"); }, {"not base64"}));
}

TEST(EtcdJson, Base64IsStrict) {
  EXPECT_EQ(base64_decode("QQ==", "t"), "A");
  EXPECT_EQ(base64_decode("QUI=", "t"), "AB");
  EXPECT_EQ(base64_decode("AAAA", "t"), std::string(3, '\0'));
  // '=' only at the end and at most two; no whitespace (EVP_DecodeBlock alone takes these).
  for (const char* bad : {"=AAA", "AA=A", "A===", "====", "QQ==QQ==", "AAAA    ", "  AAAA", "QQ=\n",
                          "AA\nA", "QUI=\r\n\r\n", "QQ-_"}) {
    EXPECT_TRUE(
        throws_with<ProtocolError>([&] { base64_decode(bad, "ctx"); }, {"ctx", "not base64"}))
        << quote_start(bad);
  }
}

TEST(EtcdJson, IntFieldRejectsOverflowAndJunkNamingTheField) {
  Json j = Json::parse(
      R"({"max":"9223372036854775807","min":"-9223372036854775808","n":-3,"big":"9223372036854775808",)"
      R"("huge":"-99999999999999999999","unsigned":18446744073709551615,"space":" 7","plus":"+7",)"
      R"("minus":"-"})");
  EXPECT_EQ(int_field(j, "max", "t"), INT64_MAX);
  EXPECT_EQ(int_field(j, "min", "t"), INT64_MIN);
  EXPECT_EQ(int_field(j, "n", "t"), -3);
  EXPECT_EQ(int_field(j, "absent", "t", 5), 5);
  for (const char* name : {"big", "huge", "unsigned", "space", "plus", "minus"}) {
    const std::string quoted = fmt::format("'{}'", name);
    EXPECT_TRUE(throws_with<ProtocolError>([&] { int_field(j, name, "ctx"); },
                                           {"ctx", quoted.c_str(), "expected an integer"}))
        << name;
  }
}

TEST(EtcdJson, RangeReplyAsTheGatewayWritesIt) {
  Json reply = Json::parse(
      R"({"header":{"cluster_id":"1","revision":"7"},"kvs":[{"key":"Zm9v","create_revision":"2",)"
      R"("mod_revision":"5","version":"2","value":"YmFy"}],"count":"1"})");
  RangeReply r = parse_range(reply, "t");
  EXPECT_EQ(r.revision, 7);
  ASSERT_EQ(r.kvs.size(), 1u);
  EXPECT_EQ(r.kvs[0].key, "foo");
  EXPECT_EQ(r.kvs[0].value, "bar");
  EXPECT_EQ(r.kvs[0].mod_revision, 5);
  // Absent fields hold their defaults: no kvs, no count.
  RangeReply empty = parse_range(Json::parse(R"({"header":{"revision":"3"}})"), "t");
  EXPECT_TRUE(empty.kvs.empty());
  EXPECT_EQ(empty.count, 0);
  EXPECT_TRUE(throws_with<ProtocolError>([] { parse_range(Json::parse(R"({"kvs":[]})"), "ctx"); },
                                         {"ctx", "no 'header'"}));
  EXPECT_TRUE(throws_with<ProtocolError>(
      [] { parse_range(Json::parse(R"({"header":{"revision":"x"}})"), "ctx"); },
      {"'revision'", "expected an integer"}));
}

TEST(EtcdJson, TxnReplySucceededIsAbsentWhenFalse) {
  TxnReply ok = parse_txn(Json::parse(R"({"header":{"revision":"9"},"succeeded":true,)"
                                      R"("responses":[{"response_put":{"header":{}}}]})"),
                          "t");
  EXPECT_TRUE(ok.succeeded);
  EXPECT_TRUE(ok.ranges.empty());
  TxnReply failed = parse_txn(
      Json::parse(R"({"header":{"revision":"9"},"responses":[{"response_range":{"header":{},)"
                  R"("kvs":[{"key":"aw==","value":"MQ==","mod_revision":"4"}],"count":"1"}},)"
                  R"({"response_range":{"header":{}}}]})"),
      "t");
  EXPECT_FALSE(failed.succeeded);
  ASSERT_EQ(failed.ranges.size(), 2u);
  EXPECT_EQ(failed.ranges[0].kvs.at(0).value, "1");
  EXPECT_TRUE(failed.ranges[1].kvs.empty());
}

// A nested txn's reply (no header of its own) and prev_kv's version, as a counter's increment
// reads them.
TEST(EtcdJson, NestedTxnRepliesAndVersions) {
  TxnReply r = parse_txn(
      Json::parse(R"({"header":{"revision":"12"},"succeeded":true,"responses":[)"
                  R"({"response_txn":{"responses":[{"response_txn":{"succeeded":true,)"
                  R"("responses":[{"response_put":{"header":{}}}]}}]}},)"
                  R"({"response_txn":{"succeeded":true,"responses":[{"response_put":{"header":{},)"
                  R"("prev_kv":{"key":"aw==","value":"MQ==","version":"4"}}}]}}]})"),
      "t");
  EXPECT_TRUE(r.succeeded);
  ASSERT_EQ(r.txns.size(), 2u);
  EXPECT_FALSE(r.txns[0].succeeded);
  ASSERT_EQ(r.txns[0].txns.size(), 1u);
  EXPECT_TRUE(r.txns[0].txns[0].succeeded);
  EXPECT_EQ(r.txns[0].txns[0].revision, 12);
  ASSERT_EQ(r.txns[1].put_prev.size(), 1u);
  EXPECT_EQ(r.txns[1].put_prev[0]->version, 4);
  EXPECT_TRUE(throws_with<ProtocolError>(
      [] {
        parse_txn(Json::parse(R"({"header":{"revision":"1"},"responses":[{"response_txn":3}]})"),
                  "ctx");
      },
      {"ctx", "'response_txn' is not an object"}));
}

TEST(EtcdJson, WatchMessages) {
  WatchMessage created =
      parse_watch_message(R"({"result":{"header":{"revision":"2"},"created":true}})", "t");
  EXPECT_TRUE(created.created);
  EXPECT_EQ(created.put_events, 0);
  WatchMessage put = parse_watch_message(
      R"({"result":{"header":{},"events":[{"kv":{"key":"dzE="}},{"type":"DELETE","kv":{}}]}})",
      "t");
  EXPECT_EQ(put.put_events, 1);
  WatchMessage compacted = parse_watch_message(
      R"({"result":{"header":{},"canceled":true,"compact_revision":"40"}})", "t");
  EXPECT_TRUE(compacted.canceled);
  EXPECT_EQ(compacted.compact_revision, 40);
  WatchMessage error =
      parse_watch_message(R"({"error":{"grpc_code":14,"message":"no leader"}})", "t");
  EXPECT_TRUE(error.canceled);
  EXPECT_EQ(error.cancel_reason, "no leader");
  EXPECT_TRUE(throws_with<ProtocolError>([] { parse_watch_message("garbage", "ctx"); },
                                         {"ctx", "not etcd's v3 JSON API", "garbage"}));
  // Found by fuzz/etcd_reply_fuzz: a field of the wrong type is a ProtocolError, not a JSON
  // library exception.
  EXPECT_TRUE(
      throws_with<ProtocolError>([] { parse_watch_message(R"({"result":{"created":1}})", "ctx"); },
                                 {"'created' is not a boolean"}));
  EXPECT_EQ(parse_watch_message(R"({"error":{"message":7}})", "t").cancel_reason,
            R"({"message":7})");
}

TEST(EtcdJson, RepliesThatAreNotEtcdNameTheEndpointAndTheFix) {
  EXPECT_TRUE(throws_with<ProtocolError>(
      [] { parse_reply("<html>hello</html>", "etcd at h:1 (POST /v3/kv/range)"); },
      {"etcd at h:1 (POST /v3/kv/range)", "<html>hello</html>", "client port (2379"}));
  EXPECT_TRUE(throws_with<ProtocolError>([] { parse_reply("", "c"); }, {"(empty reply)"}));
  EXPECT_TRUE(throws_with<ProtocolError>([] { parse_reply("[1,2]", "c"); }, {"[1,2]"}));
  EXPECT_EQ(quote_start(std::string("a\nb\x01", 4)), "a\\nb\\x01");
  EXPECT_EQ(quote_start(std::string(200, 'x'), 5), "xxxxx...");
}

TEST(EtcdJson, ErrorReplies) {
  auto e = parse_error(R"({"error":"etcdserver: requested lease not found","code":5,)"
                       R"("message":"etcdserver: requested lease not found"})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, kGrpcNotFound);
  EXPECT_EQ(e->message, "etcdserver: requested lease not found");
  // A streaming call's error, as the lease keepalive answers from an overloaded member: read
  // as "etcdserver: request timed out" (a slow cluster), not an unknown HTTP 503 (before: the
  // keepalive gave up after connect_timeout saying "cannot reach etcd ... Check that etcd runs").
  auto stream = parse_error(R"({"error":{"grpc_code":14,"http_code":503,)"
                            R"("message":"etcdserver: request timed out",)"
                            R"("http_status":"Service Unavailable"}})");
  ASSERT_TRUE(stream);
  EXPECT_EQ(stream->code, kGrpcUnavailable);
  EXPECT_EQ(stream->message, "etcdserver: request timed out");
  EXPECT_FALSE(parse_error(R"({"error":{"grpc_code":"x"}})"));
  EXPECT_FALSE(parse_error("404 page not found"));
  EXPECT_FALSE(parse_error(R"({"code":"x"})"));
}

TEST(EtcdJson, RequestsEncodeKeysAndIntegersAsTheGatewayExpects) {
  EXPECT_EQ(put_op("k", "v", 0).dump(), R"({"key":"aw==","value":"dg=="})");
  EXPECT_EQ(put_op("k", "v", 12)["lease"], "12");
  Json count = prefix_count_op("/p/");
  EXPECT_EQ(base64_decode(count["range_end"], "t"), "/p0");  // '/' + 1
  EXPECT_EQ(base64_decode(prefix_count_op("a\xff")["range_end"], "t"), "b");
  EXPECT_EQ(compare_absent("k")["create_revision"], "0");
  EXPECT_EQ(compare_mod_revision("k", 42)["mod_revision"], "42");
  EXPECT_EQ(watch_create("k", 8)["create_request"]["start_revision"], "8");
  EXPECT_EQ(range_at_op("k", 9)["revision"], "9");
  EXPECT_EQ(touch_op("k").dump(),
            R"({"ignore_lease":true,"ignore_value":true,"key":"aw==","prev_kv":true})");
}

// A counter's value: its base plus the puts since the base was written (the key's version).
TEST(EtcdCounter, ValueIsTheBasePlusThePutsSince) {
  KeyValue kv;
  kv.value = counter_form(1, 1);
  kv.version = 1;
  EXPECT_EQ(counter_of(kv), 1);
  kv.version = 40;  // 39 increments since
  EXPECT_EQ(counter_of(kv), 40);
  EXPECT_EQ(visible_value(kv), "40");
  kv.value = counter_form(-3, 7);  // a compare-and-set wrote -3 at version 7
  kv.version = 9;
  EXPECT_EQ(counter_of(kv), -1);
  kv.value = "12";  // set() wrote an integer
  EXPECT_EQ(counter_of(kv), 12);
  EXPECT_EQ(visible_value(kv), "12");
  for (const char* junk : {"", "x", "12x"}) {
    kv.value = junk;
    EXPECT_EQ(counter_of(kv), std::nullopt) << junk;
    EXPECT_EQ(visible_value(kv), junk);
  }
  kv.value = counter_form(1, 1).substr(0, 14);  // the marker, then no ':'
  EXPECT_EQ(counter_of(kv), std::nullopt);
  EXPECT_NE(counter_ticket("/p/k", "c1", 1), counter_ticket("/p/k", "c1", 2));
  EXPECT_EQ(counter_ticket("/p/k", "c1", 1).rfind("/p/k", 0), 0u);
}

}  // namespace
}  // namespace ddp::rdzv::etcd
