#include "ddp/torch/snapshot/snapshot_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>

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
        "record without comment (expected torch_save_bytes output)");
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

namespace {

uint64_t random_u64() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof v)) return v;
  std::random_device rd;  // getrandom refused (seccomp, old kernel)
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

bool all_of_class(const std::string& s, size_t from, size_t to, bool (*ok)(char)) {
  if (from >= to) return false;
  for (size_t i = from; i < to; ++i) {
    if (!ok(s[i])) return false;
  }
  return true;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_lower_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f');
}

}  // namespace

std::string temporary_path(const std::string& target, const std::string& kind) {
  const auto slash = target.rfind('/');
  const std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  return fmt::format("{}/.{}.{}-{}-{:016x}", parent_dir(target), base, kind, ::getpid(),
                     random_u64());
}

int create_temporary(const std::string& path, std::string* tmp) {
  for (int attempt = 0;; ++attempt) {
    *tmp = temporary_path(path, "tmp");
    const int fd = ::open(tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST || attempt == 15) throw io_error("cannot create temporary file", *tmp);
  }
}

std::optional<TemporaryName> parse_temporary_name(const std::string& name) {
  if (name.size() < 2 || name[0] != '.') return std::nullopt;
  for (const std::string kind : {"tmp", "link"}) {
    const std::string tag = "." + kind + "-";
    const auto at = name.rfind(tag);
    if (at == std::string::npos || at <= 1) continue;
    const size_t pid_from = at + tag.size();
    const auto dash = name.find('-', pid_from);
    const size_t pid_to = dash == std::string::npos ? name.size() : dash;
    if (!all_of_class(name, pid_from, pid_to, is_digit) || pid_to - pid_from > 9) continue;
    if (dash != std::string::npos && !all_of_class(name, dash + 1, name.size(), is_lower_hex)) {
      continue;
    }
    return TemporaryName{name.substr(1, at - 1), kind,
                         std::stol(name.substr(pid_from, pid_to - pid_from))};
  }
  return std::nullopt;
}

void write_file_atomically(const std::string& path, const std::vector<char>& bytes) {
  const std::string dir = parent_dir(path);
  std::string tmp;
  const int fd = create_temporary(path, &tmp);
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
