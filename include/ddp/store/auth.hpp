#pragma once
// Shared-secret authentication for TcpStore (challenge-response, docs/store-protocol.md).
//
// Mutual: a client holding a token sends a fresh random nonce in its hello; the server answers
// with its own nonce and HMAC-SHA256(token, server context || client nonce || server nonce),
// which the client checks before it answers HMAC-SHA256(token, client context || server
// nonce); the server compares in constant time. So neither side can be impersonated by a
// process that does not know the token (one that took the store's port first, say). The token
// itself never crosses the wire, and a recorded answer is useless for another connection (new
// nonces each time).

#include <optional>
#include <string>

namespace ddp::store_auth {

// Name of the environment variable that supplies the token when options leave it unset.
constexpr const char* kTokenEnvVar = "DDP_STORE_TOKEN";
// Name of the environment variable naming a file that holds the token (ddprun sets it for
// its workers when given --rdzv-conf token_file=...).
constexpr const char* kTokenFileEnvVar = "DDP_STORE_TOKEN_FILE";
constexpr size_t kNonceBytes = 32;

// The token to use: `configured` when set (an empty string means "no auth"), otherwise
// $DDP_STORE_TOKEN when set and non-empty, otherwise the contents of the file named by
// $DDP_STORE_TOKEN_FILE when set and non-empty (trailing whitespace removed), otherwise none
// (empty string). An unreadable or empty token file is a UsageError naming the variable.
std::string resolve_token(const std::optional<std::string>& configured);

// The token in the file `path` names (the value of $DDP_STORE_TOKEN_FILE), trailing whitespace
// removed. UsageError naming the variable and the path when unreadable, empty or unsafe
// (read_token_file).
std::string read_token_file_variable(const std::string& path);

// The token in the file at `path`, trailing whitespace removed; `setting` names where the path
// came from in messages ("--rdzv-conf token_file=/x"). The token is the job's secret, so the
// file must be a regular file that only its owner can change and nobody else can read: a
// UsageError with the fix when it cannot be read, is empty, is not a regular file (a FIFO
// would block), has permission bits for other users (chmod 600), is writable by its group, or
// belongs to another user than this process's or root. Links are followed (Kubernetes mounts
// secrets through them); what is checked is the file they lead to, through the descriptor read.
std::string read_token_file(const std::string& path, const std::string& setting);

// kNonceBytes from OpenSSL's CSPRNG. Throws StoreError if it fails.
std::string make_nonce();

// HMAC-SHA256(token, "ddp-store-auth-v1" || nonce), 32 raw bytes.
std::string proof(const std::string& token, const std::string& nonce);

// The server's proof: HMAC-SHA256(token, "ddp-store-server-v1" || client_nonce ||
// server_nonce), 32 raw bytes. Its own context keeps it from ever equalling a client proof.
std::string server_proof(const std::string& token, const std::string& client_nonce,
                         const std::string& server_nonce);

// Constant-time comparison (CRYPTO_memcmp); different lengths compare unequal.
bool proofs_equal(const std::string& expected, const std::string& received);

}  // namespace ddp::store_auth
