#pragma once
// Removing a directory tree without std::filesystem::remove_all.
//
// PyTorch's CUDA wheels (2.11 seen) export their own copy of std::filesystem::remove_all from
// libtorch.so, built from a newer libstdc++ than any system has: it calls the private
// recursive_directory_iterator::__erase through a weak reference that no system libstdc++
// (GCC 12 to 14 checked) exports, so it jumps to address 0 on the first entry it removes. A
// call in a program (or a Python extension) whose symbol lookup reaches libtorch.so before
// libstdc++ binds to that copy. ddp removes trees with this function instead, which uses only
// POSIX (nftw, unlink, rmdir) and so cannot be bound to a wheel's copy. docs/gpu.md.

#include <string>
#include <system_error>

namespace ddp {

// Removes `path` and, when it is a directory, everything below it, depth first. Symbolic
// links are removed, never followed. A path that does not exist is not an error. Returns the
// number of entries removed; on failure sets `ec` (errno of the first entry that could not be
// removed), stops, and returns what was removed so far. Never throws.
size_t remove_tree(const std::string& path, std::error_code& ec) noexcept;

// The same, throwing ddp::Error (naming the path and the cause) on failure.
size_t remove_tree(const std::string& path);

}  // namespace ddp
