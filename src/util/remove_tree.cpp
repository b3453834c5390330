#include "ddp/util/remove_tree.hpp"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <fmt/format.h>

#include "ddp/util/error.hpp"

namespace ddp {

namespace {

// nftw's callback takes no context argument; the walk of one thread is reached through these
// (thread_local, so concurrent removals in different threads do not mix).
thread_local size_t removed_count = 0;
thread_local int first_errno = 0;

int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  // FTW_DP: a directory whose entries were visited (FTW_DEPTH); FTW_DNR: one that could not be
  // read, whose removal will then fail and report why.
  const bool is_dir = type == FTW_DP || type == FTW_DNR;
  if ((is_dir ? ::rmdir(path) : ::unlink(path)) != 0) {
    if (errno == ENOENT) return 0;  // removed meanwhile by someone else: the goal holds
    first_errno = errno;
    return 1;  // stops the walk
  }
  ++removed_count;
  return 0;
}

}  // namespace

size_t remove_tree(const std::string& path, std::error_code& ec) noexcept {
  ec.clear();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return 0;
  }
  removed_count = 0;
  first_errno = 0;
  // FTW_DEPTH: entries before their directory; FTW_PHYS: links are not followed. 64 open
  // directories at most; deeper trees are still walked (nftw closes and reopens).
  const int rc = ::nftw(path.c_str(), remove_entry, 64, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) ec.assign(first_errno != 0 ? first_errno : errno, std::generic_category());
  return removed_count;
}

size_t remove_tree(const std::string& path) {
  std::error_code ec;
  const size_t removed = remove_tree(path, ec);
  if (ec) throw Error(fmt::format("cannot remove {}: {}", path, ec.message()));
  return removed;
}

}  // namespace ddp
