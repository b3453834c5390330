// How the etcd client classifies a failed request (etcd_http.hpp's contract): which failures
// go on to the next member, and the one message of each final failure (cause and fix).

#include <curl/curl.h>
#include <gtest/gtest.h>

#include "etcd_http.hpp"

namespace ddp::rdzv::etcd {
namespace {

template <class E>
std::string final_message(const Failure& f) {
  EXPECT_FALSE(f.retry);
  try {
    std::rethrow_exception(f.final_error);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
  return "";
}

Attempt curl_failure(int code, std::string error, bool connected = false) {
  Attempt a;
  a.curl_code = code;
  a.curl_error = std::move(error);
  a.connected = connected;
  return a;
}

Attempt http_reply(long status, std::string body) {
  Attempt a;
  a.http_status = status;
  a.body = std::move(body);
  a.connected = true;
  return a;
}

const std::string kMember = "10.0.0.1:2379";
const std::string kRequest = "POST /v3/kv/put";

TEST(EtcdClassify, UnreachableAndLeaderlessMembersAreRetriedElsewhere) {
  HttpOptions o;
  for (const Attempt& a :
       {curl_failure(CURLE_COULDNT_CONNECT, "Failed to connect: Connection refused"),
        curl_failure(CURLE_COULDNT_RESOLVE_HOST, "Could not resolve host: nohost"),
        curl_failure(CURLE_OPERATION_TIMEDOUT, "Connection timed out after 5000 ms", false),
        curl_failure(CURLE_GOT_NOTHING, "Empty reply from server", true),
        curl_failure(CURLE_RECV_ERROR, "Recv failure: Connection reset by peer", true),
        http_reply(
            503,
            R"({"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"})")}) {
    Failure f = classify(a, kMember, kRequest, o);
    EXPECT_TRUE(f.retry) << a.curl_error << a.body;
    EXPECT_FALSE(f.reason.empty());
  }
}

// etcd's back-pressure refuses before proposing: any request, a write too, is sent again.
TEST(EtcdClassify, AnOverloadedEtcdIsRetriedEvenForAWrite) {
  HttpOptions o;
  Failure f = classify(http_reply(500, R"({"error":"etcdserver: too many requests","code":2,)"
                                       R"("message":"etcdserver: too many requests"})"),
                       kMember, kRequest, o, /*idempotent=*/false);
  EXPECT_TRUE(f.retry);
  EXPECT_EQ(f.reason.rfind("overloaded", 0), 0u) << f.reason;
}

// etcd 3.4 during an election on a starved cluster: its request timeout ran out while raft took
// no proposal. As "etcdserver: request timed out": retried (on another member), a write too.
TEST(EtcdClassify, EtcdsOwnRequestTimeoutIsRetriedLikeNoLeader) {
  HttpOptions o;
  for (const char* body :
       {R"({"error":"context deadline exceeded","code":2,"message":"context deadline exceeded"})",
        R"({"code":4,"message":"context deadline exceeded"})"}) {
    Failure f = classify(http_reply(500, body), kMember, "POST /v3/kv/txn", o,
                         /*idempotent=*/false);
    EXPECT_TRUE(f.retry) << body;
    EXPECT_EQ(f.reason.rfind("unavailable", 0), 0u) << f.reason;
    EXPECT_NE(f.reason.find("etcdserver:"), std::string::npos) << f.reason;
  }
  // Any other unknown refusal stays final.
  final_message<StoreError>(
      classify(http_reply(500, R"({"code":2,"message":"something else"})"), kMember, kRequest, o));
}

// The lease keepalive is a streaming call: its errors come as {"error": {"grpc_code": ...}}.
// An overloaded member's request timeout in that shape is a slow cluster's (a read_timeout
// budget), a lost lease a LeaseNotFoundError; before, both were an unknown "HTTP 503" or a
// ProtocolError, and 10,000 agents' renewals gave up after connect_timeout saying "cannot reach
// etcd".
TEST(EtcdClassify, AStreamingCallsErrorsAreReadLikeOthers) {
  HttpOptions o;
  Failure timed_out = classify(
      http_reply(
          503,
          R"({"error":{"grpc_code":14,"http_code":503,)"
          R"("message":"etcdserver: request timed out","http_status":"Service Unavailable"}})"),
      kMember, "POST /v3/lease/keepalive", o, /*idempotent=*/true);
  EXPECT_TRUE(timed_out.retry);
  EXPECT_NE(timed_out.reason.find("unavailable: etcdserver: request timed out"), std::string::npos)
      << timed_out.reason;
  final_message<LeaseNotFoundError>(
      classify(http_reply(404, R"({"error":{"grpc_code":5,"http_code":404,)"
                               R"("message":"etcdserver: requested lease not found"}})"),
               kMember, "POST /v3/lease/keepalive", o));
}

TEST(EtcdClassify, AMemberThatAcceptedButNeverAnsweredIsATimeout) {
  HttpOptions o;
  std::string m = final_message<TimeoutError>(classify(
      curl_failure(CURLE_OPERATION_TIMEDOUT, "Operation timed out", true), kMember, kRequest, o));
  EXPECT_NE(m.find("did not answer within 60.0 s (--rdzv-conf read_timeout)"), std::string::npos)
      << m;
}

TEST(EtcdClassify, AnIdempotentRequestThatTimedOutGoesToTheNextMember) {
  // A stopped (SIGSTOPped) member accepts connections and never answers: a read, a lease
  // renewal or a watch is sent to the next member instead of failing after read_timeout.
  HttpOptions o;
  Failure f = classify(curl_failure(CURLE_OPERATION_TIMEDOUT, "Operation timed out", true), kMember,
                       "POST /v3/kv/range", o, /*idempotent=*/true);
  EXPECT_TRUE(f.retry);
  EXPECT_NE(f.reason.find("no answer"), std::string::npos) << f.reason;
}

TEST(EtcdClassify, TlsFailuresNameTheCauseAndTheFix) {
  HttpOptions o;
  o.https = true;
  o.cacert = "/ca.pem";
  o.cert = "/node.pem";
  o.key = "/node.key";
  std::string m = final_message<StoreError>(
      classify(curl_failure(CURLE_PEER_FAILED_VERIFICATION,
                            "SSL certificate problem: unable to get local issuer certificate"),
               kMember, kRequest, o));
  EXPECT_NE(m.find("presented a server certificate that cacert=/ca.pem does not verify"),
            std::string::npos)
      << m;
  m = final_message<StoreError>(classify(
      curl_failure(CURLE_RECV_ERROR,
                   "OpenSSL SSL_read: error:0A000418:SSL routines::tlsv1 alert unknown ca, errno 0",
                   true),
      kMember, kRequest, o));
  EXPECT_NE(m.find("refused this node's client certificate cert=/node.pem"), std::string::npos)
      << m;
  EXPECT_NE(m.find("--trusted-ca-file"), std::string::npos) << m;
  m = final_message<StoreError>(classify(
      curl_failure(CURLE_SSL_CONNECT_ERROR, "error:0A00010B:SSL routines::wrong version number"),
      kMember, kRequest, o));
  EXPECT_NE(m.find("does not speak TLS"), std::string::npos) << m;
  EXPECT_NE(m.find("protocol=http"), std::string::npos) << m;
  m = final_message<UsageError>(
      classify(curl_failure(CURLE_SSL_CERTPROBLEM, "could not load PEM client certificate"),
               kMember, kRequest, o));
  EXPECT_NE(m.find("cert=/node.pem"), std::string::npos) << m;
  o.cert.reset();
  o.key.reset();
  m = final_message<StoreError>(classify(
      curl_failure(CURLE_RECV_ERROR, "OpenSSL SSL_read: tlsv13 alert certificate required", true),
      kMember, kRequest, o));
  EXPECT_NE(m.find("requires a client certificate"), std::string::npos) << m;
}

TEST(EtcdClassify, PlainHttpToAnHttpsEtcd) {
  HttpOptions o;
  std::string m = final_message<StoreError>(classify(
      http_reply(400, "Client sent an HTTP request to an HTTPS server.\n"), kMember, kRequest, o));
  EXPECT_NE(m.find("serves HTTPS: pass --rdzv-conf protocol=https"), std::string::npos) << m;
}

TEST(EtcdClassify, RepliesThatAreNotEtcdAndEtcdRefusals) {
  HttpOptions o;
  std::string m = final_message<ProtocolError>(
      classify(http_reply(404, "404 page not found\n"), kMember, kRequest, o));
  EXPECT_NE(m.find("HTTP 404"), std::string::npos) << m;
  EXPECT_NE(m.find("not etcd's v3 JSON API"), std::string::npos) << m;
  m = final_message<ProtocolError>(
      classify(curl_failure(CURLE_WEIRD_SERVER_REPLY, "Received HTTP/0.9 when not allowed", true),
               kMember, kRequest, o));
  EXPECT_NE(m.find("not HTTP"), std::string::npos) << m;
  m = final_message<LeaseNotFoundError>(classify(
      http_reply(404,
                 R"({"error":"x","code":5,"message":"etcdserver: requested lease not found"})"),
      kMember, kRequest, o));
  EXPECT_NE(m.find("lease not found"), std::string::npos) << m;
  m = final_message<StoreError>(
      classify(http_reply(401, R"({"code":16,"message":"etcdserver: user name is empty"})"),
               kMember, kRequest, o));
  EXPECT_NE(m.find("--client-cert-auth"), std::string::npos) << m;
}

}  // namespace
}  // namespace ddp::rdzv::etcd
