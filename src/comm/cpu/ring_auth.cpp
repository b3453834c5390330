#include "ring_auth.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "ddp/util/error.hpp"

namespace ddp::detail::ring_auth {

namespace {

// Binds the MAC to this protocol and version: a proof made for anything else (the store's
// handshake uses other contexts) never verifies here.
constexpr char kContext[] = "ddp-ring-hello-v1";

void put_be32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}

uint32_t get_be32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string from_hex(const std::string& hex) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  bool ok = hex.size() == 2 * kSecretBytes;
  for (size_t i = 0; ok && i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    ok = hi >= 0 && lo >= 0;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  if (!ok) {
    throw ProtocolError(fmt::format(
        "leaders' ring: the secret in the store is not {} hex digits ({} characters); another "
        "program wrote the ring's keys, or ranks run different ddp versions",
        2 * kSecretBytes, hex.size()));
  }
  return out;
}

}  // namespace

std::string make_secret_hex() {
  unsigned char bytes[kSecretBytes];
  if (RAND_bytes(bytes, static_cast<int>(kSecretBytes)) != 1) {
    throw NetworkError("leaders' ring: OpenSSL could not generate the ring's random secret");
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

std::string proof(const std::string& secret_hex, uint32_t from, uint32_t to) {
  const std::string key = from_hex(secret_hex);
  std::string message = kContext;
  put_be32(message, from);
  put_be32(message, to);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &mac_len) == nullptr ||
      mac_len != kProofBytes) {
    throw NetworkError("leaders' ring: OpenSSL HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

std::string hello(const std::string& secret_hex, uint32_t from, uint32_t to) {
  std::string out(kMagic, kMagicBytes);
  put_be32(out, from);
  out += proof(secret_hex, from, to);
  return out;
}

std::string check_hello(const std::string& received, const std::string& secret_hex, uint32_t from,
                        uint32_t to) {
  if (received.size() != kHelloBytes) {
    return fmt::format("sent {} bytes where the ring hello has {}", received.size(), kHelloBytes);
  }
  if (received.compare(0, kMagicBytes, kMagic, kMagicBytes) != 0) {
    return "its first bytes are not a ring hello (not ddp, or a ddp from before ring "
           "authentication)";
  }
  const uint32_t claimed = get_be32(received.data() + kMagicBytes);
  if (claimed != from) {
    return fmt::format("it claims ring rank {}, but only ring rank {} connects here", claimed,
                       from);
  }
  const std::string expected = proof(secret_hex, from, to);
  if (CRYPTO_memcmp(expected.data(), received.data() + kMagicBytes + 4, kProofBytes) != 0) {
    return fmt::format(
        "its proof for ring rank {} is wrong (it does not know this ring's secret from the "
        "store: another job, or a rank of this job that read another group's keys)",
        from);
  }
  return "";
}

}  // namespace ddp::detail::ring_auth
