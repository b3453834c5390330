// The cpu backend's point-to-point receive checks every chunk header its peer wrote into the
// shared segment before that header sizes a copy (issue 49, finding 10). A peer process that
// publishes a chunk larger than the channel, a message that grows or changes tag halfway, a
// chunk at the wrong offset, or an early message no process could hold aside makes the
// receiver's recv fail with a CollectiveError naming that rank: before, the receiver copied
// what the header said, past the channel buffer and past its own.
//
// Two ShmGroups of one 2-rank segment in one process: rank 0 is the "peer", driven through
// ShmGroup::publish_raw_chunk from its own thread; rank 1 receives.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "call_info.hpp"
#include "cpu/shm_group.hpp"
#include "ddp/util/error.hpp"

namespace ddp::detail {
namespace {

constexpr int kTag = 7;

class ShmCorruptPeer : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_.ranks = 2;
    layout_.slot_bytes = 4096;
    layout_.p2p_bytes = 4096;
    const std::string name = "/ddp_corrupt_peer_" + std::to_string(::getpid()) + "_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ShmSegment created = ShmSegment::create(name, layout_.total_bytes());
    ShmGroup::initialize(created.data(), layout_);
    ShmSegment opened = ShmSegment::open(name, layout_.total_bytes());
    created.unlink();
    opened.release_name();
    peer_ = std::make_unique<ShmGroup>(std::move(created), layout_, 0, std::vector<int>{0, 1},
                                       std::chrono::microseconds(0));
    receiver_ = std::make_unique<ShmGroup>(std::move(opened), layout_, 1, std::vector<int>{0, 1},
                                           std::chrono::microseconds(0));
    call_.kind = OpKind::kRecv;
    call_.root = 0;
    call_.tag = kTag;
  }

  ShmContext context(const std::string& where) const {
    ShmContext ctx;
    ctx.call = &call_;
    ctx.where = where;
    ctx.timeout = std::chrono::seconds(20);
    ctx.deadline = Clock::now() + ctx.timeout;
    return ctx;
  }

  // rank 1 receives `bytes` with kTag while rank 0's thread runs `send`; rank 1's error text
  // ("" when the recv returned).
  std::string receive_while(size_t bytes, const std::function<void(const ShmContext&)>& send) {
    std::thread sender([&] {
      try {
        send(context("rank 0 of 2 (test peer)"));
      } catch (const Error&) {
        // The receiver stopped taking chunks after the corrupt one: the peer's later wait ends.
      }
    });
    std::vector<char> buffer(bytes + 64, 'x');
    std::string error;
    try {
      receiver_->recv(buffer.data(), bytes, 0, kTag, context("rank 1 of 2 (test receiver)"));
    } catch (const CollectiveError& e) {
      error = e.what();
    }
    sender.join();
    // Whatever happened, nothing was written past the recv's buffer.
    for (size_t i = bytes; i < buffer.size(); ++i) EXPECT_EQ(buffer[i], 'x') << "byte " << i;
    return error;
  }

  ShmLayout layout_;
  CallInfo call_;
  std::unique_ptr<ShmGroup> peer_, receiver_;
};

TEST_F(ShmCorruptPeer, AChunkLargerThanTheChannelIsRefused) {
  const size_t bytes = layout_.p2p_bytes + 1024;  // what the header claims, in one chunk
  const std::string error = receive_while(bytes, [&](const ShmContext& ctx) {
    peer_->publish_raw_chunk(1, kTag, bytes, bytes, 0, ctx);
  });
  EXPECT_NE(error.find("rank 0 published a corrupt point-to-point chunk: 5120 bytes at offset 0"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("at most 4096 bytes a chunk"), std::string::npos) << error;
  EXPECT_NE(error.find("restart the job"), std::string::npos) << error;
}

TEST_F(ShmCorruptPeer, AMessageThatGrowsHalfwayIsRefused) {
  const size_t bytes = 2 * layout_.p2p_bytes;
  const std::string error = receive_while(bytes, [&](const ShmContext& ctx) {
    peer_->publish_raw_chunk(1, kTag, layout_.p2p_bytes, bytes, 0, ctx);
    // The second chunk says the message is four chunks long: a receiver that believed it would
    // copy chunks three and four past its buffer.
    peer_->publish_raw_chunk(1, kTag, layout_.p2p_bytes, 4 * layout_.p2p_bytes, layout_.p2p_bytes,
                             ctx);
  });
  EXPECT_NE(error.find("4096 bytes at offset 4096 of a 16384-byte message with tag 7, where this "
                       "rank expected offset 4096 of 8192 bytes with tag 7"),
            std::string::npos)
      << error;
}

TEST_F(ShmCorruptPeer, AChunkAtAnotherOffsetOrTagIsRefused) {
  const size_t bytes = 2 * layout_.p2p_bytes;
  std::string error = receive_while(bytes, [&](const ShmContext& ctx) {
    peer_->publish_raw_chunk(1, kTag, layout_.p2p_bytes, bytes, 0, ctx);
    peer_->publish_raw_chunk(1, kTag, layout_.p2p_bytes, bytes, 100, ctx);
  });
  EXPECT_NE(error.find("at offset 100 of a 8192-byte message"), std::string::npos) << error;

  SetUp();  // a fresh segment: the channel above is out of step
  error = receive_while(bytes, [&](const ShmContext& ctx) {
    peer_->publish_raw_chunk(1, kTag, layout_.p2p_bytes, bytes, 0, ctx);
    peer_->publish_raw_chunk(1, kTag + 1, layout_.p2p_bytes, bytes, layout_.p2p_bytes, ctx);
  });
  EXPECT_NE(error.find("message with tag 8, where this rank expected offset 4096 of 8192 bytes "
                       "with tag 7"),
            std::string::npos)
      << error;
}

TEST_F(ShmCorruptPeer, AnEarlyMessageNoProcessCanHoldIsACollectiveError) {
  // Another tag than the recv's: the receiver would hold it aside for a later recv. Its claimed
  // size is the peer's word; 2^62 bytes cannot be allocated.
  const std::string error = receive_while(16, [&](const ShmContext& ctx) {
    peer_->publish_raw_chunk(1, kTag + 1, layout_.p2p_bytes, uint64_t{1} << 62, 0, ctx);
  });
  EXPECT_NE(error.find("rank 0 sent a message with tag 8 of 4611686018427387904 bytes before the "
                       "one this recv waits for, and it cannot be held aside"),
            std::string::npos)
      << error;
}

TEST_F(ShmCorruptPeer, WellFormedMessagesStillArrive) {
  // The checks refuse nothing a real sender publishes: two chunks and an empty message.
  std::vector<char> sent(2 * layout_.p2p_bytes - 10);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 7);
  std::thread sender([&] {
    peer_->send(sent.data(), sent.size(), 1, kTag, context("rank 0 of 2 (test peer)"));
    peer_->send(nullptr, 0, 1, kTag, context("rank 0 of 2 (test peer)"));
  });
  std::vector<char> got(sent.size());
  receiver_->recv(got.data(), got.size(), 0, kTag, context("rank 1 of 2 (test receiver)"));
  receiver_->recv(nullptr, 0, 0, kTag, context("rank 1 of 2 (test receiver)"));
  sender.join();
  EXPECT_EQ(got, sent);
}

}  // namespace
}  // namespace ddp::detail
