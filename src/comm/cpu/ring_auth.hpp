#pragma once
// The leaders' ring hello: how a leader proves to the next one that it is the ring's previous
// rank (internal header; the wire format is documented in docs/comm.md, "The leaders' ring:
// connection setup").
//
// Every accepting leader draws a fresh secret per ring and publishes it in the job's store
// beside its address; the connecting leader opens its connection with a hello carrying
// HMAC-SHA256 under that secret of both ring ranks. Only clients of the store can read the
// secret, so a process outside the job cannot join the ring when the store requires the job's
// token (docs/store-protocol.md); a stray or stale connection (port scanner, another job, an
// older ddp) is refused whatever the store. A proof is good for one ordered pair of leaders of
// one ring (fresh secret, both ranks MACed) and the secret itself never crosses the ring.
//
// Why a secret in the store and not the job's token: the comm layer is handed a Store, not the
// token (a HashStore, a FileStore or a user's store may have none), and a secret only store
// clients can read is exactly as strong as the store's own protection.

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::detail::ring_auth {

// Framing: kMagic, the connecting ring rank (uint32, big-endian), the proof.
inline constexpr char kMagic[] = "ddpring1";  // 8 bytes on the wire, no terminator
inline constexpr size_t kMagicBytes = sizeof(kMagic) - 1;
inline constexpr size_t kSecretBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256
inline constexpr size_t kHelloBytes = kMagicBytes + 4 + kProofBytes;

// kSecretBytes from OpenSSL's CSPRNG, as lowercase hex (the form published in the store).
// Throws NetworkError if the generator fails.
std::string make_secret_hex();

// HMAC-SHA256(key = secret, message = "ddp-ring-hello-v1" || be32(from) || be32(to)), raw.
// `secret_hex` is make_secret_hex()'s form; the key is the decoded bytes. ProtocolError if it
// is not kSecretBytes of hex.
std::string proof(const std::string& secret_hex, uint32_t from, uint32_t to);

// The kHelloBytes that ring rank `from` sends on its connection to ring rank `to`.
std::string hello(const std::string& secret_hex, uint32_t from, uint32_t to);

// Whether `received` (kHelloBytes) is the hello of ring rank `from` to `to` under the
// secret: "" if so, otherwise why not, for the refusal's log line (never the expected
// proof). The proof is compared in constant time (CRYPTO_memcmp).
std::string check_hello(const std::string& received, const std::string& secret_hex, uint32_t from,
                        uint32_t to);

}  // namespace ddp::detail::ring_auth
