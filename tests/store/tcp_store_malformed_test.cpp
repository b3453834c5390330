// Malformed input reaches the server while a good client keeps working: each bad connection
// gets an error frame (when one can be sent) and is closed; the server and the data survive.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <thread>

#include "ddp/util/error.hpp"
#include "store_test_util.hpp"

namespace ddp::test {
namespace {

using store_protocol::Op;

class MalformedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = start_server();
    good_ = std::make_unique<TcpStore>(client_options(server_->port()));
    good_->set("stable", "value");
  }

  // The good client still works and the data is intact.
  void expect_good_client_works() {
    EXPECT_EQ(good_->get("stable"), "value");
    EXPECT_EQ(good_->add("ops", 1), ++ops_);
  }

  // Expects an error frame of kind `kind` whose message contains `text`, then EOF.
  void expect_error_then_close(const net::Socket& sock, const std::string& text) {
    auto frame = raw_read_frame(sock);
    EXPECT_EQ(frame.op, Op::kError);
    ASSERT_EQ(frame.fields.size(), 2u);
    EXPECT_EQ(frame.fields[0], store_protocol::kErrorProtocol);
    EXPECT_NE(frame.fields[1].find(text), std::string::npos) << frame.fields[1];
    char byte;
    EXPECT_THROW(net::read_exact(sock.fd(), &byte, 1, net::Clock::now() + 10s, "server"),
                 NetworkError);
  }

  net::Socket ready_raw_client() {
    auto sock = raw_connect(server_->port());
    raw_send(sock, encode(Op::kHello, {"raw"}));
    EXPECT_EQ(raw_read_frame(sock).op, Op::kOk);
    return sock;
  }

  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStore> good_;
  int64_t ops_ = 0;
};

TEST_F(MalformedTest, GarbageBytesAreRejected) {
  auto sock = raw_connect(server_->port());
  raw_send(sock, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  expect_error_then_close(sock, "bad magic");
  expect_good_client_works();
  EXPECT_GE(server_->num_protocol_errors(), 1u);
}

TEST_F(MalformedTest, UnsupportedVersionIsNamed) {
  auto sock = raw_connect(server_->port());
  std::string bytes = encode(Op::kHello, {"raw"});
  bytes[4] = 9;
  raw_send(sock, bytes);
  expect_error_then_close(sock, "protocol version 9 is not supported");
  expect_good_client_works();
}

TEST_F(MalformedTest, OversizedLengthIsRejectedWithoutWaitingForThePayload) {
  auto sock = ready_raw_client();
  std::string header = encode(Op::kSet, {}).substr(0, store_protocol::kHeaderBytes);
  header[12] = header[13] = header[14] = header[15] = '\xff';  // 4 GiB payload
  raw_send(sock, header);
  expect_error_then_close(sock, "exceeds the limit");
  expect_good_client_works();
}

TEST_F(MalformedTest, InconsistentFieldLengthsAreRejected) {
  auto sock = ready_raw_client();
  std::string bytes = encode(Op::kSet, {"k", "v"});
  bytes[20] = 100;  // first field claims 100 bytes
  raw_send(sock, bytes);
  expect_error_then_close(sock, "claims 100 bytes");
  expect_good_client_works();
}

TEST_F(MalformedTest, WrongFieldCountAndUnknownOpcodeAreRejected) {
  {
    auto sock = ready_raw_client();
    raw_send(sock, encode(Op::kSet, {"only-key"}, 2));
    expect_error_then_close(sock, "set needs 2 fields");
  }
  {
    auto sock = ready_raw_client();
    raw_send(sock, encode(static_cast<Op>(0x7e), {}, 2));
    expect_error_then_close(sock, "unknown request");
  }
  expect_good_client_works();
}

TEST_F(MalformedTest, TruncatedFrameThenDisconnectLeavesNoTrace) {
  for (int i = 0; i < 3; ++i) {
    auto sock = ready_raw_client();
    std::string bytes = encode(Op::kSet, {"stable", "overwritten"}, 2);
    raw_send(sock, bytes.substr(0, bytes.size() - 3));
    // Socket closes here with the frame incomplete.
  }
  {
    // Half a header, then a half-close.
    auto sock = raw_connect(server_->port());
    raw_send(sock, std::string("DDPS\x01", 5));
    ::shutdown(sock.fd(), SHUT_WR);
  }
  expect_good_client_works();
  good_->ping();
  EXPECT_EQ(server_->num_connections(), 1u);
}

TEST_F(MalformedTest, SilentHalfFrameDoesNotStallOthers) {
  // A client that sends part of a frame and then says nothing must not block the loop.
  auto sock = ready_raw_client();
  raw_send(sock, encode(Op::kSet, {"k", "v"}, 2).substr(0, 10));
  for (int i = 0; i < 20; ++i) expect_good_client_works();
  // It can even finish later; its frame is then processed normally.
  raw_send(sock, encode(Op::kSet, {"k", "v"}, 2).substr(10));
  EXPECT_EQ(raw_read_frame(sock).op, Op::kOk);
  EXPECT_EQ(good_->get("k"), "v");
}

}  // namespace
}  // namespace ddp::test

namespace ddp::test {
namespace {

TEST(ServerLimitsTest, ValueOverTheFrameLimitIsAProtocolErrorAndTheClientRecovers) {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.token = "";
  options.max_frame_bytes = 1024;
  TcpStoreServer server(options);
  server.start();
  TcpStore client(client_options(server.port()));
  try {
    client.set("big", std::string(4096, 'x'));
    FAIL() << "the server accepted a frame over its limit";
  } catch (const ProtocolError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("exceeds the limit of 1024 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos) << what;
  }
  // The server closed that connection; the next call reconnects.
  client.set("small", "ok");
  EXPECT_EQ(client.get("small"), "ok");
  EXPECT_FALSE(client.check({"big"}));
}

TEST(ServerLimitsTest, ConnectionThatNeverSaysHelloIsClosedAfterTheHandshakeTimeout) {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.token = "";
  options.handshake_timeout = 100ms;
  TcpStoreServer server(options);
  server.start();
  auto idle = raw_connect(server.port());
  auto frame = raw_read_frame(idle);  // blocks until the server gives up on it
  EXPECT_EQ(frame.op, Op::kError);
  EXPECT_NE(frame.fields.at(1).find("handshake not completed within 100 ms"), std::string::npos)
      << frame.fields.at(1);
  char byte;
  EXPECT_THROW(net::read_exact(idle.fd(), &byte, 1, net::Clock::now() + 10s, "server"),
               NetworkError);
  // Clients that do say hello are not affected by the timeout once ready.
  TcpStore client(client_options(server.port()));
  std::this_thread::sleep_for(200ms);
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
}

}  // namespace
}  // namespace ddp::test
