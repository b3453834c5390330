// Interruptible waits on the TCP store: cancel_wait on the wire (the waiting wait answers
// `timeout` at once; a cancel that arrives after the answer is ignored, with no reply of its
// own) and TcpStore::wait_interruptibly over it (the connection stays usable).
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "ddp/store/wait_interrupter.hpp"
#include "store_test_util.hpp"

namespace ddp::test {
namespace {

using store_protocol::encode_i64;
using store_protocol::Op;

net::Socket ready_raw_client(uint16_t port) {
  auto sock = raw_connect(port);
  raw_send(sock, encode(Op::kHello, {"raw"}));
  EXPECT_EQ(raw_read_frame(sock).op, Op::kOk);
  return sock;
}

TEST(TcpStoreCancel, CancelWaitAnswersTheWaitingWaitWithTimeoutAtOnce) {
  auto server = start_server();
  auto sock = ready_raw_client(server->port());
  raw_send(sock, encode(Op::kWait, {encode_i64(60000), "never"}, 7));
  std::this_thread::sleep_for(100ms);  // the wait is parked
  raw_send(sock, encode(Op::kCancelWait, {}, 7));
  // Within raw_read_frame's 10 s, not the wait's 60 s.
  auto reply = raw_read_frame(sock);
  EXPECT_EQ(reply.op, Op::kTimeout);
  EXPECT_EQ(reply.request_id, 7u);
  EXPECT_EQ(reply.fields, std::vector<std::string>{"never"});
  // In step: the next request gets the next reply.
  raw_send(sock, encode(Op::kPing, {}, 8));
  auto ping = raw_read_frame(sock);
  EXPECT_EQ(ping.op, Op::kOk);
  EXPECT_EQ(ping.request_id, 8u);
}

TEST(TcpStoreCancel, ACancelAfterTheWaitWasAnsweredGetsNoReply) {
  auto server = start_server();
  auto sock = ready_raw_client(server->port());
  raw_send(sock, encode(Op::kSet, {"k", "v"}, 1));
  EXPECT_EQ(raw_read_frame(sock).op, Op::kOk);
  raw_send(sock, encode(Op::kWait, {encode_i64(60000), "k"}, 2));
  auto answered = raw_read_frame(sock);
  EXPECT_EQ(answered.op, Op::kOk);
  EXPECT_EQ(answered.request_id, 2u);
  raw_send(sock, encode(Op::kCancelWait, {}, 2));
  raw_send(sock, encode(Op::kPing, {}, 3));
  auto ping = raw_read_frame(sock);
  EXPECT_EQ(ping.op, Op::kOk);
  EXPECT_EQ(ping.request_id, 3u) << "the late cancel must not be answered";
}

TEST(TcpStoreCancel, ACancelNamingAnotherRequestLeavesTheWaitWaiting) {
  auto server = start_server();
  auto sock = ready_raw_client(server->port());
  TcpStore setter(client_options(server->port()));
  raw_send(sock, encode(Op::kWait, {encode_i64(60000), "later"}, 4));
  raw_send(sock, encode(Op::kCancelWait, {}, 3));
  std::this_thread::sleep_for(100ms);
  setter.set("later", "1");
  auto reply = raw_read_frame(sock);
  EXPECT_EQ(reply.op, Op::kOk) << "only the wait's own request id cancels it";
  EXPECT_EQ(reply.request_id, 4u);
}

TEST(TcpStoreCancel, WaitInterruptiblyEndsWhenInterruptedAndTheStoreGoesOn) {
  auto server = start_server();
  TcpStore store(client_options(server->port()));
  WaitInterrupter interrupter;
  auto interrupt = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(300ms);
    interrupter.interrupt();
  });
  // 60 s: a wait the interrupt did not end would answer kTimedOut only then.
  EXPECT_EQ(store.wait_interruptibly({"never"}, 60s, interrupter), WaitOutcome::kInterrupted);
  interrupt.get();
  EXPECT_EQ(store.wait_interruptibly({"never"}, 60s, interrupter), WaitOutcome::kInterrupted)
      << "interrupted until cleared";
  interrupter.clear();
  EXPECT_EQ(store.wait_interruptibly({"never"}, 200ms, interrupter), WaitOutcome::kTimedOut);
  auto setter = std::async(std::launch::async, [&] {
    TcpStore other(client_options(server->port()));
    std::this_thread::sleep_for(200ms);
    other.set("k", "1");
  });
  EXPECT_EQ(store.wait_interruptibly({"k"}, 30s, interrupter), WaitOutcome::kSet);
  setter.get();
  // The same connection, still in step after a cancelled wait.
  EXPECT_EQ(store.get("k"), "1");
  EXPECT_EQ(store.add("n", 2), 2);
}

}  // namespace
}  // namespace ddp::test
