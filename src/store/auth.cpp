#include "ddp/store/auth.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::store_auth {

namespace {
// Binds the MAC to this protocol and version so it cannot be replayed elsewhere.
constexpr char kContext[] = "ddp-store-auth-v1";
constexpr char kServerContext[] = "ddp-store-server-v1";

std::string hmac_sha256(const std::string& token, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &mac_len) == nullptr) {
    throw StoreError("store auth: OpenSSL HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<char*>(mac), mac_len);
}
}  // namespace

std::string resolve_token(const std::optional<std::string>& configured) {
  if (configured) return *configured;
  std::string token = env::get_or(kTokenEnvVar, "");
  if (!token.empty()) return token;
  const std::string path = env::get_or(kTokenFileEnvVar, "");
  return path.empty() ? "" : read_token_file_variable(path);
}

std::string read_token_file_variable(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  if (!in || !(contents << in.rdbuf())) {
    throw UsageError(fmt::format(
        "{}={}: cannot read the store token file ({}); it must be readable by every process "
        "of the job (ddprun passes --rdzv-conf token_file= to its workers this way)",
        kTokenFileEnvVar, path, std::strerror(errno)));
  }
  std::string token = contents.str();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
    token.pop_back();
  }
  if (token.empty()) {
    throw UsageError(fmt::format("{}={}: the store token file is empty", kTokenFileEnvVar, path));
  }
  return token;
}

std::string make_nonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(kNonceBytes)) !=
      1) {
    throw StoreError("store auth: OpenSSL could not generate a random nonce");
  }
  return nonce;
}

std::string proof(const std::string& token, const std::string& nonce) {
  return hmac_sha256(token, std::string(kContext) + nonce);
}

std::string server_proof(const std::string& token, const std::string& client_nonce,
                         const std::string& server_nonce) {
  return hmac_sha256(token, std::string(kServerContext) + client_nonce + server_nonce);
}

bool proofs_equal(const std::string& expected, const std::string& received) {
  if (expected.size() != received.size()) return false;
  return CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

}  // namespace ddp::store_auth
