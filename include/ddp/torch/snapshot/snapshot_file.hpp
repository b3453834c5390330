#pragma once
// Snapshot files on disk: checksummed zip archives written atomically.
//
// Checksum: a snapshot is the zip archive torch::pickle_save produces, and the SHA-256 of
// those bytes is stored in the archive's own comment field (the last field of the zip's
// end-of-central-directory record) as "ddp-snapshot sha256=<64 hex digits>". A zip comment
// is part of the format, so Python's torch.load, unzip and zipfile read the file unchanged;
// the checksum travels inside the one file that is renamed into place, so data and checksum
// can never be out of step (a side-car file would need a second rename). To verify, the
// comment is cut off, its length field set back to 0, and the rest hashed.
//
// Atomic write: bytes go to a temporary file in the target's directory, which is fsynced,
// renamed over the target and the directory fsynced: after a crash at any moment the target
// is either the old file or the complete new one.

#include <string>
#include <vector>

namespace ddp {

enum class ChecksumStatus {
  kValid,     // comment present and matching
  kMissing,   // a zip without a ddp checksum (e.g. written by Python's torch.save)
  kMismatch,  // comment present, bytes differ: corrupt
  kNotZip,    // no end-of-central-directory record at the end: truncated or not a zip
};

// Appends the checksum comment to a zip archive without a comment. Throws UsageError when the
// bytes do not end with an end-of-central-directory record with an empty comment.
std::vector<char> add_zip_checksum(std::vector<char> zip);

// Checks the comment written by add_zip_checksum. `detail` receives a human-readable reason.
ChecksumStatus verify_zip_checksum(const std::vector<char>& bytes, std::string* detail = nullptr);

// Lowercase hex SHA-256 of the bytes.
std::string sha256_hex(const char* data, size_t size);

// Writes `bytes` to `path` atomically (see above). Throws Error naming the path and errno.
void write_file_atomically(const std::string& path, const std::vector<char>& bytes);

// The whole file. Throws UsageError naming the path when it cannot be read.
std::vector<char> read_whole_file(const std::string& path);

// fsync of a directory, so renames and unlinks in it survive a crash.
void fsync_directory(const std::string& dir);

}  // namespace ddp
