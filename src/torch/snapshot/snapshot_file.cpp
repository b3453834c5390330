#include "ddp/torch/snapshot/snapshot_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "ddp/util/error.hpp"

namespace ddp {

namespace {

constexpr size_t kEocdSize = 22;  // end-of-central-directory record without comment
constexpr const char kPrefix[] = "ddp-snapshot sha256=";
constexpr size_t kPrefixSize = sizeof(kPrefix) - 1;
constexpr size_t kCommentSize = kPrefixSize + 64;

bool is_eocd(const char* p) {
  return p[0] == 'P' && p[1] == 'K' && p[2] == 5 && p[3] == 6;
}
uint16_t comment_length(const char* eocd) {
  return static_cast<uint16_t>(static_cast<uint8_t>(eocd[20]) |
                               (static_cast<uint8_t>(eocd[21]) << 8));
}

Error io_error(const std::string& what, const std::string& path) {
  return Error(fmt::format("{} {}: {}", what, path, std::strerror(errno)));
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::string sha256_hex(const char* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, size, digest, &len, EVP_sha256(), nullptr) != 1) {
    throw Error("sha256: OpenSSL's EVP_Digest failed");
  }
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

std::vector<char> add_zip_checksum(std::vector<char> zip) {
  if (zip.size() < kEocdSize || !is_eocd(zip.data() + zip.size() - kEocdSize) ||
      comment_length(zip.data() + zip.size() - kEocdSize) != 0) {
    throw UsageError(
        "add_zip_checksum: the bytes do not end with a zip end-of-central-directory "
        "record without comment (expected torch::pickle_save output)");
  }
  const std::string comment = kPrefix + sha256_hex(zip.data(), zip.size());
  char* eocd = zip.data() + zip.size() - kEocdSize;
  eocd[20] = static_cast<char>(kCommentSize & 0xff);
  eocd[21] = static_cast<char>(kCommentSize >> 8);
  zip.insert(zip.end(), comment.begin(), comment.end());
  return zip;
}

ChecksumStatus verify_zip_checksum(const std::vector<char>& bytes, std::string* detail) {
  auto say = [&](ChecksumStatus s, std::string why) {
    if (detail) *detail = std::move(why);
    return s;
  };
  const size_t n = bytes.size();
  if (n >= kEocdSize + kCommentSize) {
    const char* eocd = bytes.data() + n - kCommentSize - kEocdSize;
    if (is_eocd(eocd) && comment_length(eocd) == kCommentSize &&
        std::memcmp(eocd + kEocdSize, kPrefix, kPrefixSize) == 0) {
      std::vector<char> original(bytes.begin(), bytes.end() - kCommentSize);
      original[original.size() - 2] = 0;
      original[original.size() - 1] = 0;
      const std::string want(eocd + kEocdSize + kPrefixSize, 64);
      const std::string got = sha256_hex(original.data(), original.size());
      if (got != want) {
        return say(ChecksumStatus::kMismatch,
                   fmt::format("checksum mismatch: the file records sha256 {} but its bytes "
                               "hash to {}",
                               want, got));
      }
      return say(ChecksumStatus::kValid, "sha256 " + got + " verified");
    }
  }
  if (n >= kEocdSize && is_eocd(bytes.data() + n - kEocdSize) &&
      comment_length(bytes.data() + n - kEocdSize) == 0) {
    return say(ChecksumStatus::kMissing, "no ddp checksum (a zip written by another tool)");
  }
  return say(ChecksumStatus::kNotZip,
             fmt::format("{} bytes not ending in a zip end-of-central-directory record: "
                         "truncated or not a snapshot",
                         n));
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw io_error("cannot open directory", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  errno = err;
  if (rc != 0) throw io_error("cannot fsync directory", dir);
}

void write_file_atomically(const std::string& path, const std::vector<char>& bytes) {
  const std::string dir = parent_dir(path);
  const auto slash = path.rfind('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string tmp = fmt::format("{}/.{}.tmp-{}", dir, base, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error("cannot create temporary snapshot file", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const size_t chunk = bytes.size() - done;
    const ssize_t w = ::write(fd, bytes.data() + done, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = err;
      throw io_error("cannot write (disk full?)", tmp);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = err;
    throw io_error("cannot fsync", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    throw io_error("cannot rename " + tmp + " to", path);
  }
  fsync_directory(dir);
}

std::vector<char> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw UsageError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  return bytes;
}

}  // namespace ddp
