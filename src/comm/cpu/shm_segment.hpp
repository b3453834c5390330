#pragma once
// ShmSegment: a POSIX shared-memory object mapped into this process (internal header).
// The creator sizes it with posix_fallocate so a full /dev/shm is a clear error at creation
// instead of a SIGBUS on first touch. unlink() removes the name once every rank has mapped it;
// the mapping stays valid until the segment is destroyed.

#include <cstddef>
#include <string>

namespace ddp::detail {

class ShmSegment {
 public:
  static ShmSegment create(const std::string& name, size_t bytes);
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

  // Removes the name from /dev/shm; ignores a name that is already gone.
  void unlink();
  // The name is known to be gone (another rank unlinked it): do not unlink on destruction.
  void release_name() { owner_ = false; }

 private:
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;  // created it: unlinks on destruction in case peers never did
};

}  // namespace ddp::detail
