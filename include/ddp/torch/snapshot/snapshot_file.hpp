#pragma once
// Snapshot files on disk: checksummed zip archives written atomically.
//
// Checksum: a snapshot is the zip archive torch_save_bytes produces (torch.save's format), and the
// SHA-256 of those bytes is stored in the archive's own comment field (the last field of the zip's
// end-of-central-directory record) as "ddp-snapshot sha256=<64 hex digits>". A zip comment
// is part of the format, so Python's torch.load, unzip and zipfile read the file unchanged;
// the checksum travels inside the one file that is renamed into place, so data and checksum
// can never be out of step (a side-car file would need a second rename). To verify, the
// comment is cut off, its length field set back to 0, and the rest hashed.
//
// Atomic write: bytes go to a temporary file in the target's directory, which is fsynced,
// renamed over the target and the directory fsynced: after a crash at any moment the target
// is either the old file or the complete new one.
//
// Temporaries beside a target DIR/BASE are named DIR/.BASE.<kind>-<pid>-<16 hex digits>, kind
// "tmp" (write_file_atomically) or "link" (SnapshotManager's hard link to the newest epoch
// file). They are created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, or link(2), which never
// follows or replaces what is there) under a random name, so a file or symlink planted in the
// directory is never written through. The pid lets cleanup tell a dead writer's leftovers from
// a live writer's in-flight file.

#include <optional>
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

// A fresh temporary name beside `target` (see above); `kind` is "tmp" or "link".
std::string temporary_path(const std::string& target, const std::string& kind);

// Creates a "tmp" temporary beside `path` exclusively (see above), retrying on a name
// collision; returns its descriptor (open for writing) and sets `tmp` to its name. Throws
// Error naming the file when it cannot be created.
int create_temporary(const std::string& path, std::string* tmp);

struct TemporaryName {
  std::string target_base;  // BASE: the file the temporary was going to become
  std::string kind;         // "tmp" or "link"
  long pid = 0;             // the writer's process id
};

// Parses a directory entry named like temporary_path's, or like the older `.BASE.<kind>-<pid>`
// of earlier builds; nullopt for any other name.
std::optional<TemporaryName> parse_temporary_name(const std::string& name);

// The whole file. Throws UsageError naming the path when it cannot be read.
std::vector<char> read_whole_file(const std::string& path);

// fsync of a directory, so renames and unlinks in it survive a crash.
void fsync_directory(const std::string& dir);

}  // namespace ddp
