#pragma once
// The checkpoint directory: DIR/step-<8 digits>/ per checkpoint; which are complete; writing
// a file so that a reader sees the old one or the whole new one, never a part.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dcp_metadata.hpp"

namespace ddp::checkpoint {

std::string step_dir(const std::string& dir, int64_t step);
// The step of a step-<digits> name, or nullopt.
std::optional<int64_t> step_of_name(const std::string& name);

struct StepDir {
  int64_t step = 0;
  std::string path;
};

// Every step directory, complete or not, newest first.
std::vector<StepDir> step_dirs(const std::string& dir);

// The metadata of a complete checkpoint directory; UsageError saying why it is not one (no
// .metadata: an unfinished save; a referenced file missing or shorter than the records).
dcp::Metadata read_complete(const std::string& path);

// Complete checkpoints, newest first; `skipped` gets "path: reason" for each incomplete one.
std::vector<StepDir> complete_step_dirs(const std::string& dir,
                                        std::vector<std::string>* skipped = nullptr);

// Writes a new temporary beside path (random name, exclusive, never through a link), fsyncs it,
// renames it to path and fsyncs the directory (ddp::write_file_atomically, the snapshots' own).
void write_file_atomically(const std::string& path, const std::string& bytes);

// Removes what a killed save left: step directories without .metadata. Called by rank 0 while
// no save is in flight.
void remove_incomplete(const std::string& dir, std::optional<int64_t> below_step = std::nullopt);
// Removes all but the newest `keep` complete checkpoints.
void prune_complete(const std::string& dir, int keep);

}  // namespace ddp::checkpoint
