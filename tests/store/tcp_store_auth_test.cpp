// Shared-secret authentication: matching tokens are accepted; a missing or wrong token is
// refused with a clear StoreError, logged with the peer address, and never touches the data.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "ddp/store/auth.hpp"
#include "ddp/util/error.hpp"
#include "store_test_util.hpp"

namespace ddp::test {
namespace {

std::string to_hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 15]);
  }
  return hex;
}

TEST(TcpStoreAuthTest, MatchingTokenIsAccepted) {
  auto server = start_server(std::string("s3cret"));
  TcpStore client(client_options(server->port(), 10s, std::string("s3cret")));
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
  EXPECT_EQ(server->num_auth_refusals(), 0u);
}

TEST(TcpStoreAuthTest, ClientWithoutTokenIsRefusedAndToldWhy) {
  LogCapture capture;
  auto server = start_server(std::string("s3cret"));
  try {
    TcpStore client(client_options(server->port(), 10s, std::string("")));
    FAIL() << "a client without a token got in";
  } catch (const StoreError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(server->port()) + " requires an auth token"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("DDP_STORE_TOKEN"), std::string::npos) << what;
  }
  EXPECT_EQ(server->num_auth_refusals(), 1u);
  EXPECT_NE(capture.text().find("refused client 127.0.0.1:"), std::string::npos) << capture.text();
}

TEST(TcpStoreAuthTest, WrongTokenIsRefusedAsMismatch) {
  auto server = start_server(std::string("s3cret"));
  try {
    TcpStore client(client_options(server->port(), 10s, std::string("guess")));
    FAIL() << "a client with the wrong token got in";
  } catch (const StoreError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("token mismatch"), std::string::npos) << what;
    EXPECT_NE(what.find("pass the same token"), std::string::npos) << what;
  }
}

TEST(TcpStoreAuthTest, RefusedClientRequestsNeverTouchTheData) {
  auto server = start_server(std::string("s3cret"));
  TcpStore good(client_options(server->port(), 10s, std::string("s3cret")));
  good.set("k", "original");
  // A raw client skips the handshake and sends a set; then another answers the challenge
  // wrongly and pipelines a set behind the answer.
  {
    auto sock = raw_connect(server->port());
    raw_send(sock, encode(store_protocol::Op::kSet, {"k", "hijacked"}));
    auto reply = raw_read_frame(sock);
    EXPECT_EQ(reply.op, store_protocol::Op::kError);
  }
  {
    auto sock = raw_connect(server->port());
    raw_send(sock, encode(store_protocol::Op::kHello, {"raw"}));
    auto challenge = raw_read_frame(sock);
    ASSERT_EQ(challenge.op, store_protocol::Op::kChallenge);
    std::string wrong = store_auth::proof("guess", challenge.fields.at(0));
    raw_send(sock, encode(store_protocol::Op::kAuth, {wrong}, 2) +
                       encode(store_protocol::Op::kSet, {"k", "hijacked"}, 3) +
                       encode(store_protocol::Op::kSet, {"new-key", "x"}, 4));
    auto reply = raw_read_frame(sock);
    EXPECT_EQ(reply.op, store_protocol::Op::kError);
    EXPECT_EQ(reply.fields.at(0), store_protocol::kErrorAuth);
  }
  EXPECT_EQ(good.get("k"), "original");
  EXPECT_FALSE(good.check({"new-key"}));
  EXPECT_EQ(good.num_keys(), 1);
  EXPECT_EQ(server->num_auth_refusals(), 2u);
}

TEST(TcpStoreAuthTest, TokenComesFromTheEnvironmentWhenNotGiven) {
  setenv(store_auth::kTokenEnvVar, "from-env", 1);
  auto server = start_server(std::nullopt);  // reads DDP_STORE_TOKEN
  TcpStore env_client(client_options(server->port(), 10s, std::nullopt));
  env_client.set("k", "v");
  unsetenv(store_auth::kTokenEnvVar);
  EXPECT_THROW(TcpStore(client_options(server->port(), 10s, std::nullopt)), StoreError);
  TcpStore explicit_client(client_options(server->port(), 10s, std::string("from-env")));
  EXPECT_EQ(explicit_client.get("k"), "v");
}

// A process that took the store's port first and answers without auth must not be trusted by a
// client that holds a token: it would read and forge the job's keys.
TEST(TcpStoreAuthTest, ClientWithTokenRefusesAServerWithoutAuth) {
  auto server = start_server(std::string(""));
  try {
    TcpStore client(client_options(server->port(), 10s, std::string("s3cret")));
    FAIL() << "a client holding a token trusted a server without auth";
  } catch (const StoreError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(server->port())), std::string::npos) << what;
    EXPECT_NE(what.find("without authentication"), std::string::npos) << what;
    EXPECT_NE(what.find("nother process"), std::string::npos) << what;
  }
}

// An impostor that challenges the client but does not know the token cannot answer the
// client's own challenge; the client refuses it before sending its proof (which the impostor
// could otherwise relay to the real store to get in). Two impostors: one that sends a
// challenge without a proof (as a version-1 server without mutual auth did), one that makes
// up a proof.
TEST(TcpStoreAuthTest, ClientRefusesAServerThatCannotProveTheToken) {
  for (bool with_made_up_proof : {false, true}) {
    SCOPED_TRACE(with_made_up_proof ? "made-up proof" : "no proof");
    auto listener = net::listen_tcp("127.0.0.1", 0, 4);
    uint16_t port = net::local_port(listener.fd());
    std::string client_answer = "(none)";
    std::thread impostor([&] {
      try {
        pollfd pfd{listener.fd(), POLLIN, 0};
        if (::poll(&pfd, 1, 10000) != 1) return;
        net::Socket sock(::accept(listener.fd(), nullptr, nullptr));
        auto hello = raw_read_frame(sock);
        std::string nonce = store_auth::make_nonce();
        std::vector<std::string> fields{nonce};
        if (with_made_up_proof) fields.push_back(store_auth::proof("guess", nonce));
        raw_send(sock, encode(store_protocol::Op::kChallenge, fields, hello.request_id));
        auto answer = raw_read_frame(sock);
        client_answer = store_protocol::op_name(answer.op);
      } catch (const Error&) {
        // The client hung up instead of answering: what it should do.
      }
    });
    std::string what;
    bool store_error = false;
    try {
      TcpStore client(client_options(port, 10s, std::string("s3cret")));
    } catch (const Error& e) {  // caught here so the impostor thread is always joined
      what = e.what();
      store_error = dynamic_cast<const StoreError*>(&e) != nullptr;
    }
    impostor.join();
    EXPECT_EQ(client_answer, "(none)") << "the client answered an impostor's challenge";
    EXPECT_TRUE(store_error) << "expected a StoreError, got: " << what;
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
    EXPECT_NE(what.find("could not prove"), std::string::npos) << what;
  }
}

// Before authentication a peer may send only small frames: a large frame header is refused at
// once instead of buffering up to max_frame_bytes for the whole handshake window.
TEST(TcpStoreAuthTest, LargeFrameBeforeAuthIsRefusedAtOnce) {
  LogCapture capture;
  auto server = start_server(std::string("s3cret"));
  auto sock = raw_connect(server->port());
  std::string hello = encode(store_protocol::Op::kHello, {std::string(1 << 20, 'x')});
  // Send the header and a little of the payload only: the server must not wait for the rest.
  raw_send(sock, hello.substr(0, 4096));
  auto reply = raw_read_frame(sock);
  EXPECT_EQ(reply.op, store_protocol::Op::kError);
  ASSERT_EQ(reply.fields.size(), 2u);
  EXPECT_EQ(reply.fields[0], store_protocol::kErrorProtocol);
  EXPECT_NE(reply.fields[1].find("before authentication"), std::string::npos) << reply.fields[1];
  EXPECT_EQ(server->num_protocol_errors(), 1u);
  EXPECT_NE(capture.text().find("before authentication"), std::string::npos) << capture.text();
  TcpStore good(client_options(server->port(), 10s, std::string("s3cret")));
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
}

// ddprun hands its workers the job's token as a file path (DDP_STORE_TOKEN_FILE), so the
// stores a worker opens through ddp (rank 0's MASTER_ADDR:MASTER_PORT store) use the token
// on both the server and the client side without the secret in the environment.
TEST(TcpStoreAuthTest, TokenComesFromTheTokenFileVariable) {
  TempDir dir;
  std::string path = dir.file("token");
  { std::ofstream(path) << "file-secret\n"; }
  ::chmod(path.c_str(), 0600);
  unsetenv(store_auth::kTokenEnvVar);
  setenv(store_auth::kTokenFileEnvVar, path.c_str(), 1);
  auto server = start_server(std::nullopt);
  TcpStore member(client_options(server->port(), 10s, std::nullopt));
  member.set("k", "v");
  unsetenv(store_auth::kTokenFileEnvVar);
  EXPECT_THROW(TcpStore(client_options(server->port(), 10s, std::string(""))), StoreError);
  TcpStore explicit_client(client_options(server->port(), 10s, std::string("file-secret")));
  EXPECT_EQ(explicit_client.get("k"), "v");
}

TEST(TcpStoreAuthTest, UnreadableTokenFileIsAUsageErrorNamingTheVariable) {
  unsetenv(store_auth::kTokenEnvVar);
  setenv(store_auth::kTokenFileEnvVar, "/nonexistent-ddp-dir/token", 1);
  try {
    store_auth::resolve_token(std::nullopt);
    FAIL() << "an unreadable token file was ignored";
  } catch (const UsageError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("DDP_STORE_TOKEN_FILE=/nonexistent-ddp-dir/token"), std::string::npos)
        << what;
  }
  unsetenv(store_auth::kTokenFileEnvVar);
}

// Known answers for the published wire format (docs/store-protocol.md, "Handshake and
// authentication"), computed outside this project with OpenSSL's command line (Python's hmac
// module gives the same bytes):
//   C=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f   client nonce
//   S=202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f   server nonce
//   { printf 'ddp-store-auth-v1'; echo -n $S | xxd -r -p; } |
//       openssl dgst -sha256 -mac HMAC -macopt key:ddp-kat-token
//   { printf 'ddp-store-server-v1'; echo -n $C$S | xxd -r -p; } |
//       openssl dgst -sha256 -mac HMAC -macopt key:ddp-kat-token
// A mismatch means the code no longer speaks the documented protocol (and other versions of
// ddp, or other implementations of the doc, can no longer authenticate with it).
TEST(TcpStoreAuthTest, ProofsMatchTheDocumentedWireFormat) {
  const std::string token = "ddp-kat-token";
  std::string client_nonce;
  std::string server_nonce;
  for (int i = 0; i < 32; ++i) {
    client_nonce.push_back(static_cast<char>(i));
    server_nonce.push_back(static_cast<char>(32 + i));
  }
  EXPECT_EQ(to_hex(store_auth::proof(token, server_nonce)),
            "d0fe0b7e8792ed5dea3a355d8af3ce84edefa2105e6aba1fc0e20867142baf39");
  EXPECT_EQ(to_hex(store_auth::server_proof(token, client_nonce, server_nonce)),
            "8508f0624b3f8ffccf40764125ad13c061ca2140d689ceafa4d72d3a072a08e2");
}

// Properties beyond the known answers: determinism, and dependence on every input.
TEST(TcpStoreAuthTest, ProofDependsOnTokenAndNonce) {
  std::string nonce = store_auth::make_nonce();
  EXPECT_EQ(nonce.size(), store_auth::kNonceBytes);
  EXPECT_NE(nonce, store_auth::make_nonce());
  EXPECT_EQ(store_auth::proof("t", nonce), store_auth::proof("t", nonce));
  EXPECT_NE(store_auth::proof("t", nonce), store_auth::proof("u", nonce));
  std::string other = store_auth::make_nonce();
  EXPECT_EQ(store_auth::server_proof("t", nonce, other),
            store_auth::server_proof("t", nonce, other));
  EXPECT_NE(store_auth::server_proof("t", nonce, other),
            store_auth::server_proof("u", nonce, other));
  EXPECT_NE(store_auth::server_proof("t", nonce, other),
            store_auth::server_proof("t", other, nonce));
  // A server proof is never a valid client proof, so one side's answer cannot be replayed.
  EXPECT_NE(store_auth::server_proof("t", "", other), store_auth::proof("t", other));
  EXPECT_TRUE(store_auth::proofs_equal("abc", "abc"));
  EXPECT_FALSE(store_auth::proofs_equal("abc", "abd"));
  EXPECT_FALSE(store_auth::proofs_equal("abc", "ab"));
}

}  // namespace
}  // namespace ddp::test
