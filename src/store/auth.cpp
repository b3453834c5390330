#include "ddp/store/auth.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::store_auth {

namespace {
// Binds the MAC to this protocol and version so it cannot be replayed elsewhere.
constexpr char kContext[] = "ddp-store-auth-v1";
constexpr char kServerContext[] = "ddp-store-server-v1";
// Closes a descriptor when the reader returns or throws.
struct ClosedOnExit {
  int fd;
  ~ClosedOnExit() { ::close(fd); }
};

// A token file holds one secret; anything this large is the wrong file.
constexpr size_t kMaxTokenFileBytes = 64 << 10;

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
  return read_token_file(path, fmt::format("{}={}", kTokenFileEnvVar, path));
}

std::string read_token_file(const std::string& path, const std::string& setting) {
  // O_NONBLOCK: opening a FIFO planted under the name must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    throw UsageError(fmt::format(
        "{}: cannot read the store token file ({}); create it on every node with the job's "
        "secret, mode 600 (ddprun hands its path to the workers as {})",
        setting, std::strerror(errno), kTokenFileEnvVar));
  }
  const ClosedOnExit file{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw UsageError(
        fmt::format("{}: not a regular file; the store token must be in a file of "
                    "its own (mode 600)",
                    setting));
  }
  const unsigned mode = st.st_mode & 07777;
  if ((mode & (S_IRWXO | S_IWGRP)) != 0) {
    throw UsageError(fmt::format(
        "{}: the store token file has mode {:04o}, so other users can {} the job's secret; "
        "run chmod 600 {} (in Kubernetes: defaultMode 0400 or 0440 on the secret's volume)",
        setting, mode, (mode & S_IROTH) != 0 ? "read" : "change", path));
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    throw UsageError(fmt::format(
        "{}: the store token file belongs to uid {}, not to this user (uid {}) or root, so "
        "another user controls the job's secret; create the file yourself (mode 600)",
        setting, st.st_uid, ::geteuid()));
  }
  std::string token;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw UsageError(
          fmt::format("{}: cannot read the store token file ({})", setting, std::strerror(errno)));
    }
    if (n == 0) break;
    token.append(buf, static_cast<size_t>(n));
    if (token.size() > kMaxTokenFileBytes) {
      throw UsageError(
          fmt::format("{}: the store token file is over {} bytes; it should hold "
                      "the secret alone",
                      setting, kMaxTokenFileBytes));
    }
  }
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
    token.pop_back();
  }
  if (token.empty()) throw UsageError(fmt::format("{}: the store token file is empty", setting));
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
