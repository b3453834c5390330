// Checks of files, folders and sockets on this host before ddprun trusts them (local_trust.hpp).
#include "local_trust.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/launcher/process.hpp"

namespace ddp::launcher::detail {

std::optional<std::string> read_own_file(const std::string& path, size_t max_bytes,
                                         std::string& why) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) {
    why = errno == ELOOP ? "a symbolic link" : std::strerror(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "not a regular file";
    return std::nullopt;
  }
  if (st.st_uid != ::geteuid()) {
    why = fmt::format("owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid());
    return std::nullopt;
  }
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      why = std::strerror(errno);
      return std::nullopt;
    }
    if (n == 0) return text;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      why = fmt::format("larger than {} bytes", max_bytes);
      return std::nullopt;
    }
  }
}

std::string private_dir_problem(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "not a folder (a link or a file)";
  if (st.st_uid != ::geteuid() || (st.st_mode & 0077) != 0) {
    return fmt::format("not a private folder of this user (owner uid {}, mode {:o})", st.st_uid,
                       st.st_mode & 07777);
  }
  return "";
}

std::string socket_peer_problem(int fd, pid_t pid) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return fmt::format("its peer is unknown ({})", std::strerror(errno));
  }
  if (cred.uid != ::geteuid()) {
    return fmt::format("it is served by uid {}, not by this user (uid {})", cred.uid, ::geteuid());
  }
  if (cred.pid != pid) {
    return fmt::format("it is served by pid {}, not by the agent's pid {}", cred.pid, pid);
  }
  return "";
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace ddp::launcher::detail
