#include "ddp/launcher/kernel_log.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>

namespace ddp::launcher {

namespace {

// /dev/kmsg hands out one record per read and fails with EINVAL when the buffer is too small
// for it; records are at most about 8 KiB (PRINTK_MESSAGE_MAX plus the dictionary).
constexpr size_t kRecordBuffer = 16384;
// Bounds one read_oom_kills call: the ring holds far fewer records than this.
constexpr int kMaxRecordsPerRead = 100000;

// The message part of a record: after "PRIO,SEQ,USEC,FLAGS;" for /dev/kmsg, after "[ time] "
// for a dmesg line; only its first line (continuation lines hold the dictionary).
std::string message_of(const std::string& record) {
  std::string msg = record;
  const size_t semi = msg.find(';');
  const size_t comma = msg.find(',');
  if (semi != std::string::npos && comma != std::string::npos && comma < semi &&
      std::isdigit(static_cast<unsigned char>(msg[0]))) {
    msg = msg.substr(semi + 1);
  } else if (!msg.empty() && msg[0] == '[') {
    const size_t close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
  }
  const size_t nl = msg.find('\n');
  if (nl != std::string::npos) msg.resize(nl);
  return msg;
}

std::optional<int64_t> digits_at(const std::string& s, size_t pos, size_t* end) {
  size_t e = pos;
  while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
  if (e == pos || e - pos > 18) return std::nullopt;
  *end = e;
  return std::stoll(s.substr(pos, e - pos));
}

}  // namespace

std::optional<OomKillRecord> parse_oom_kill_record(const std::string& record) {
  const std::string msg = message_of(record);
  // "Out of memory: Killed process 1234 (python3) total-vm:..." and
  // "Memory cgroup out of memory: Killed process 1234 (python3) ...".
  const std::string killed = "out of memory: Killed process ";
  size_t at = msg.find(killed);
  if (at == std::string::npos) at = msg.find("Out of memory: Killed process ");
  if (at != std::string::npos) {
    size_t end = 0;
    const auto pid = digits_at(msg, at + killed.size(), &end);
    if (!pid) return std::nullopt;
    size_t cut = end;
    if (msg.compare(end, 2, " (") == 0) {
      const size_t close = msg.find(") ", end + 2);
      cut = close == std::string::npos ? msg.size() : close + 1;
    }
    return OomKillRecord{*pid, msg.substr(0, cut)};
  }
  // "oom-kill:constraint=CONSTRAINT_MEMCG,...,task=python3,pid=1234,uid=0"
  if (msg.rfind("oom-kill:", 0) == 0) {
    const size_t p = msg.rfind(",pid=");
    if (p == std::string::npos) return std::nullopt;
    size_t end = 0;
    const auto pid = digits_at(msg, p + 5, &end);
    if (!pid) return std::nullopt;
    const size_t task = msg.rfind(",task=", p);
    const std::string name = task == std::string::npos ? "" : msg.substr(task + 1, end - task - 1);
    return OomKillRecord{*pid,
                         "oom-kill: " + (name.empty() ? msg.substr(p + 1, end - p - 1) : name)};
  }
  return std::nullopt;
}

KernelLog KernelLog::open_at_end(const std::string& path) {
  KernelLog log;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return log;
  log.fd_.reset(fd);
  if (::lseek(fd, 0, SEEK_END) < 0) log.fd_.reset();  // not a kmsg device: no position to keep
  return log;
}

std::vector<OomKillRecord> KernelLog::read_oom_kills() {
  std::vector<OomKillRecord> out;
  if (!fd_.valid()) return out;
  std::string buf(kRecordBuffer, '\0');
  for (int i = 0; i < kMaxRecordsPerRead; ++i) {
    const ssize_t n = ::read(fd_.get(), buf.data(), buf.size());
    if (n > 0) {
      if (auto rec = parse_oom_kill_record(buf.substr(0, static_cast<size_t>(n)))) {
        out.push_back(std::move(*rec));
      }
      continue;
    }
    // EPIPE: records were overwritten before we read them; the next read goes on after them.
    if (n < 0 && (errno == EINTR || errno == EPIPE)) continue;
    break;  // EAGAIN (nothing new), end of file, or an error
  }
  return out;
}

bool KernelLog::wait_for_record(int timeout_ms) const {
  if (!fd_.valid()) return false;
  pollfd p{fd_.get(), POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) > 0;
}

}  // namespace ddp::launcher
