#pragma once
// The IDX file format of MNIST and Fashion-MNIST, parsed without LibTorch so a fuzzer can
// drive it directly.
//
//   bytes 0-1  zero
//   byte  2    element type: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32,
//              0x0E float64 (multi-byte elements are big-endian)
//   byte  3    number of dimensions (1..8 accepted here)
//   then       one big-endian uint32 per dimension, then prod(dims) elements
//
// Every malformed input is a UsageError naming `source` (the file) and what is wrong, never a
// crash or an over-read; the caller can fix it by pointing at the right, complete file.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct IdxArray {
  uint8_t type_code = 0;      // 0x08 ... 0x0E as above
  std::vector<int64_t> dims;  // sizes, outermost first
  std::vector<uint8_t> data;  // the raw elements, big-endian as stored

  int64_t numel() const;
};

// Size in bytes of one element of an IDX type code; 0 for an unknown code.
size_t idx_element_size(uint8_t type_code);

// Parses a whole IDX file held in memory. Trailing bytes after the last element are an error
// (they mean the header does not describe the file). `max_elements` bounds the declared size
// so a corrupt header cannot ask for terabytes.
IdxArray parse_idx(const uint8_t* bytes, size_t size, const std::string& source,
                   int64_t max_elements = int64_t{1} << 32);

// The file's bytes, gunzipped when it is gzip (plain files pass through). Throws UsageError
// naming the path for a missing/unreadable file or a truncated/corrupt gzip stream.
std::vector<uint8_t> read_maybe_gzip_file(const std::string& path,
                                          size_t max_bytes = size_t{1} << 32);

// read_maybe_gzip_file + parse_idx.
IdxArray read_idx_file(const std::string& path);

}  // namespace ddp
