#include "ddp/torch/data/idx_format.hpp"

#include <zlib.h>

#include <fmt/format.h>
#include <cerrno>
#include <cstring>
#include <memory>

#include "ddp/util/error.hpp"

namespace ddp {

int64_t IdxArray::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

size_t idx_element_size(uint8_t type_code) {
  switch (type_code) {
    case 0x08:
    case 0x09:
      return 1;
    case 0x0B:
      return 2;
    case 0x0C:
    case 0x0D:
      return 4;
    case 0x0E:
      return 8;
    default:
      return 0;
  }
}

IdxArray parse_idx(const uint8_t* bytes, size_t size, const std::string& source,
                   int64_t max_elements) {
  auto fail = [&](const std::string& what) {
    return UsageError(
        fmt::format("{}: not a valid IDX file: {}. Point at an intact MNIST/Fashion-MNIST file "
                    "(e.g. /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz)",
                    source, what));
  };
  if (size < 4) {
    throw fail(fmt::format("{} bytes is shorter than the 4-byte magic number", size));
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    throw fail(
        fmt::format("wrong magic number 0x{:02x}{:02x}{:02x}{:02x} (the first two bytes "
                    "must be zero)",
                    bytes[0], bytes[1], bytes[2], bytes[3]));
  }
  IdxArray out;
  out.type_code = bytes[2];
  const size_t elem = idx_element_size(out.type_code);
  if (elem == 0) {
    throw fail(
        fmt::format("unknown element type 0x{:02x} in the magic number (expected "
                    "0x08, 0x09, 0x0b, 0x0c, 0x0d or 0x0e)",
                    out.type_code));
  }
  const int ndims = bytes[3];
  if (ndims < 1 || ndims > 8) {
    throw fail(fmt::format("{} dimensions in the magic number (expected 1 to 8)", ndims));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (size < header) {
    throw fail(fmt::format("truncated header: {} dimensions need {} bytes, the file has {}", ndims,
                           header, size));
  }
  int64_t numel = 1;
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* p = bytes + 4 + 4 * i;
    const int64_t d = (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | p[3];
    out.dims.push_back(d);
    // Checked before multiplying so the product cannot overflow.
    if (d != 0 && numel > max_elements / d) {
      throw fail(fmt::format("declared size exceeds {} elements (dimension {} is {})", max_elements,
                             i, d));
    }
    numel *= d;
  }
  const size_t payload = static_cast<size_t>(numel) * elem;
  if (size - header < payload) {
    throw fail(
        fmt::format("truncated: dimensions {} need {} data bytes after the {}-byte "
                    "header, the file has {}",
                    fmt::join(out.dims, "x"), payload, header, size - header));
  }
  if (size - header > payload) {
    throw fail(fmt::format("{} unexpected trailing bytes after {} elements",
                           size - header - payload, numel));
  }
  out.data.assign(bytes + header, bytes + header + payload);
  return out;
}

std::vector<uint8_t> read_maybe_gzip_file(const std::string& path, size_t max_bytes) {
  // gzopen reads plain files transparently, so one path serves .gz and unpacked files.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) {
    throw UsageError(
        fmt::format("{}: cannot open: {}. Check the path (Fashion-MNIST is at "
                    "/usr/share/datasets/fashion-mnist from Debian's "
                    "dataset-fashion-mnist package)",
                    path, errno ? std::strerror(errno) : "out of memory"));
  }
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    const int n = gzread(f.get(), buf, sizeof(buf));
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(f.get(), &code);
      throw UsageError(
          fmt::format("{}: cannot read{}: {}. The file is corrupt or truncated; "
                      "reinstall or re-copy it",
                      path, code == Z_ERRNO ? "" : " the gzip stream",
                      code == Z_ERRNO ? std::strerror(errno) : msg));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (out.size() > max_bytes) {
      throw UsageError(
          fmt::format("{}: larger than {} bytes once decompressed; not an IDX "
                      "dataset file",
                      path, max_bytes));
    }
  }
  // gzread returns 0 at a premature end of a gzip stream too; gzerror tells them apart.
  int code = Z_OK;
  const char* msg = gzerror(f.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END) {
    throw UsageError(
        fmt::format("{}: truncated or corrupt gzip stream after {} decompressed "
                    "bytes ({}); reinstall or re-copy the file",
                    path, out.size(), msg));
  }
  return out;
}

IdxArray read_idx_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_maybe_gzip_file(path);
  return parse_idx(bytes.data(), bytes.size(), path);
}

}  // namespace ddp
