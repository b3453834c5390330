// The frame parser is a pure function: round trips, incremental input, and every rejection.
#include <gtest/gtest.h>

#include "ddp/store/protocol.hpp"
#include "ddp/util/error.hpp"

namespace ddp::store_protocol {
namespace {

ParseResult parse(const std::string& bytes, size_t max = kDefaultMaxFrameBytes) {
  return parse_frame(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), max);
}

std::string sample() {
  Frame frame;
  frame.op = Op::kMultiSet;
  frame.request_id = 0xA1B2C3D4;
  frame.fields = {"key", std::string("\0\xff", 2), ""};
  return encode_frame(frame);
}

TEST(ProtocolTest, EncodeThenParseRoundTrips) {
  std::string bytes = sample();
  auto result = parse(bytes + "extra");
  ASSERT_EQ(result.status, ParseStatus::kComplete) << result.error;
  EXPECT_EQ(result.consumed, bytes.size());
  EXPECT_EQ(result.frame.op, Op::kMultiSet);
  EXPECT_EQ(result.frame.request_id, 0xA1B2C3D4u);
  EXPECT_EQ(result.frame.fields, (std::vector<std::string>{"key", std::string("\0\xff", 2), ""}));
}

TEST(ProtocolTest, EveryProperPrefixNeedsMore) {
  std::string bytes = sample();
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(parse(bytes.substr(0, n)).status, ParseStatus::kNeedMore) << n;
  }
}

TEST(ProtocolTest, BadMagicIsRejectedFromTheFirstByte) {
  auto result = parse("X");
  EXPECT_EQ(result.status, ParseStatus::kError);
  EXPECT_NE(result.error.find("bad magic"), std::string::npos);
}

TEST(ProtocolTest, OtherVersionIsRejectedNamingBoth) {
  std::string bytes = sample();
  bytes[4] = 2;
  auto result = parse(bytes);
  EXPECT_EQ(result.status, ParseStatus::kError);
  EXPECT_NE(result.error.find("version 2"), std::string::npos) << result.error;
  EXPECT_NE(result.error.find("speaks version 1"), std::string::npos) << result.error;
  EXPECT_EQ(result.request_id, 0xA1B2C3D4u);
}

TEST(ProtocolTest, FrameOverTheLimitIsRejectedFromTheHeader) {
  std::string bytes = sample();
  auto result = parse(bytes.substr(0, kHeaderBytes), bytes.size() - 1);
  EXPECT_EQ(result.status, ParseStatus::kError);
  EXPECT_NE(result.error.find("exceeds the limit"), std::string::npos) << result.error;
  EXPECT_EQ(parse(bytes, bytes.size()).status, ParseStatus::kComplete);
}

TEST(ProtocolTest, FieldsMustFillThePayloadExactly) {
  std::string bytes = sample();
  std::string too_long = bytes;
  too_long[20] = 50;  // first field claims more than remains
  EXPECT_EQ(parse(too_long).status, ParseStatus::kError);

  std::string huge_count = bytes;
  huge_count[16] = huge_count[17] = huge_count[18] = '\x7f';
  auto result = parse(huge_count);
  EXPECT_EQ(result.status, ParseStatus::kError);
  EXPECT_NE(result.error.find("field count"), std::string::npos) << result.error;

  std::string trailing = bytes;
  trailing[16] = 2;  // only two of three fields counted: the third is trailing garbage
  result = parse(trailing);
  EXPECT_EQ(result.status, ParseStatus::kError);
  EXPECT_NE(result.error.find("trailing"), std::string::npos) << result.error;
}

// Issue 49, finding 4: an empty field is 4 bytes on the wire and a std::string once parsed, so
// the parser caps the field count (a 64 MiB frame of empty fields became half a GiB), and the
// encoder refuses what the parser would.
TEST(ProtocolTest, FieldCountOverTheCapIsRejectedBothWays) {
  Frame frame;
  frame.op = Op::kWait;
  frame.fields.assign(kMaxFieldsPerFrame, "");
  const std::string at_cap = encode_frame(frame);
  EXPECT_EQ(parse(at_cap).status, ParseStatus::kComplete);

  frame.fields.emplace_back();
  try {
    encode_frame(frame);
    ADD_FAILURE() << "a frame of kMaxFieldsPerFrame + 1 fields was encoded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("1048577 fields exceeds the limit of 1048576"),
              std::string::npos)
        << e.what();
  }
  // The same frame from a peer that does not check: one more empty field and count.
  std::string over = at_cap + std::string(4, '\0');
  const uint32_t payload = static_cast<uint32_t>(over.size() - kHeaderBytes);
  const uint32_t count = static_cast<uint32_t>(kMaxFieldsPerFrame + 1);
  for (int i = 0; i < 4; ++i) {
    over[12 + i] = static_cast<char>(payload >> (8 * i));
    over[16 + i] = static_cast<char>(count >> (8 * i));
  }
  const auto result = parse(over);
  EXPECT_EQ(result.status, ParseStatus::kError);
  EXPECT_NE(result.error.find("field count 1048577 exceeds the limit of 1048576 fields"),
            std::string::npos)
      << result.error;
}

TEST(ProtocolTest, PayloadTooShortForAFieldCount) {
  std::string bytes = sample().substr(0, kHeaderBytes);
  bytes[12] = 2;
  bytes[13] = bytes[14] = bytes[15] = 0;
  EXPECT_EQ(parse(bytes + "ab").status, ParseStatus::kError);
}

TEST(ProtocolTest, IntegersAreEightByteLittleEndian) {
  EXPECT_EQ(encode_i64(1), std::string("\x01\0\0\0\0\0\0\0", 8));
  for (int64_t v : {int64_t{0}, int64_t{-1}, INT64_MIN, INT64_MAX, int64_t{123456789}}) {
    EXPECT_EQ(decode_i64(encode_i64(v), "v"), v);
  }
  EXPECT_THROW(decode_i64("abc", "v"), ProtocolError);
}

}  // namespace
}  // namespace ddp::store_protocol
