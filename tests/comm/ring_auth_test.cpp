// The leaders' ring hello (ring_auth.hpp): the documented wire format against a known answer
// computed outside ddp (Python's hmac module), and every way check_hello refuses a hello.

#include "cpu/ring_auth.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "ddp/util/error.hpp"

namespace ddp::test {
namespace {

namespace ra = detail::ring_auth;

// The secret 0x00..0x1f as published in the store.
const std::string kSecret = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

std::string hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

// docs/comm.md: hello = "ddpring1" || be32(from) || HMAC-SHA256(secret, "ddp-ring-hello-v1" ||
// be32(from) || be32(to)). Expected values from
//   hmac.new(bytes(range(32)), b"ddp-ring-hello-v1" + struct.pack(">II", 2, 3), "sha256")
TEST(RingAuth, HelloMatchesTheDocumentedWireFormat) {
  const std::string h = ra::hello(kSecret, 2, 3);
  ASSERT_EQ(h.size(), ra::kHelloBytes);
  ASSERT_EQ(ra::kHelloBytes, 44u);
  EXPECT_EQ(h.substr(0, 8), "ddpring1");
  EXPECT_EQ(hex(h.substr(8, 4)), "00000002");
  EXPECT_EQ(hex(h.substr(12)), "ce3084245d55c580f794d75fa0eede1a6fb5c931b0586b4c1d66ebb7bacb1217");
  // The direction is part of the MAC: 3 -> 2 is another proof.
  EXPECT_EQ(hex(ra::proof(kSecret, 3, 2)),
            "2a01bb4a163bcf4d0908f14095eead70b4804cdfbaebdcaa5ab895ea6c6b135a");
  EXPECT_EQ(ra::check_hello(h, kSecret, 2, 3), "");
}

TEST(RingAuth, SecretsAreFreshHex) {
  std::set<std::string> seen;
  for (int i = 0; i < 8; ++i) {
    const std::string s = ra::make_secret_hex();
    EXPECT_EQ(s.size(), 2 * ra::kSecretBytes);
    EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos) << s;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 8u);
}

TEST(RingAuth, CheckHelloRefusesEveryMismatchAndSaysWhy) {
  const std::string good = ra::hello(kSecret, 0, 1);
  auto refused = [&](const std::string& received, uint32_t from, uint32_t to) {
    return ra::check_hello(received, kSecret, from, to);
  };
  EXPECT_NE(refused(good.substr(0, 8), 0, 1).find("sent 8 bytes where the ring hello has 44"),
            std::string::npos);
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_NE(refused(bad_magic, 0, 1).find("not a ring hello"), std::string::npos);
  // A valid hello of rank 0 presented where rank 2 is expected: the claimed rank is named.
  EXPECT_NE(refused(good, 2, 1).find("claims ring rank 0, but only ring rank 2"),
            std::string::npos);
  // Right framing and rank, proof for another pair (0 -> 2) or under another secret.
  std::string other_pair = ra::hello(kSecret, 0, 2);
  EXPECT_NE(refused(other_pair, 0, 1).find("proof for ring rank 0 is wrong"), std::string::npos);
  const std::string other_secret = ra::hello(ra::make_secret_hex(), 0, 1);
  EXPECT_NE(refused(other_secret, 0, 1).find("proof for ring rank 0 is wrong"), std::string::npos);
  // Every single flipped bit of the proof is refused.
  for (size_t i = 12; i < good.size(); ++i) {
    std::string flipped = good;
    flipped[i] = static_cast<char>(flipped[i] ^ 1);
    EXPECT_NE(refused(flipped, 0, 1), "") << "byte " << i;
  }
}

TEST(RingAuth, MalformedSecretIsAProtocolError) {
  EXPECT_THROW(ra::proof("abc", 0, 1), ProtocolError);
  EXPECT_THROW(ra::proof(std::string(64, 'g'), 0, 1), ProtocolError);
}

}  // namespace
}  // namespace ddp::test
