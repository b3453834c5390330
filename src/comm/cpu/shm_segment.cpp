#include "shm_segment.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "ddp/util/error.hpp"

namespace ddp::detail {

namespace {

void* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw Error(fmt::format("mmap of shared memory {} ({} bytes) failed: {}", name, bytes,
                            std::strerror(err)));
  }
  ::close(fd);
  return p;
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    throw Error(
        fmt::format("shm_open({}) for the cpu backend failed: {}; is /dev/shm mounted "
                    "and writable?",
                    name, std::strerror(errno)));
  }
  const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw Error(
        fmt::format("cannot reserve {} bytes of shared memory for {}: {}; /dev/shm is "
                    "probably too small (docker: --shm-size=1g)",
                    bytes, name, std::strerror(rc)));
  }
  ShmSegment seg;
  seg.name_ = name;
  seg.size_ = bytes;
  seg.owner_ = true;
  seg.data_ = map_fd(fd, bytes, name);
  return seg;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    throw Error(
        fmt::format("shm_open({}) failed: {}; ranks with the same host id must share "
                    "/dev/shm (set DDP_HOST_ID differently for separate machines or "
                    "containers)",
                    name, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw Error(fmt::format("shared memory {} is smaller than the expected {} bytes", name, bytes));
  }
  ShmSegment seg;
  seg.name_ = name;
  seg.size_ = bytes;
  seg.data_ = map_fd(fd, bytes, name);
  return seg;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept {
  *this = std::move(o);
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    name_ = std::move(o.name_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    owner_ = std::exchange(o.owner_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  if (owner_) unlink();
}

void ShmSegment::unlink() {
  if (!name_.empty()) ::shm_unlink(name_.c_str());
  owner_ = false;
}

}  // namespace ddp::detail
