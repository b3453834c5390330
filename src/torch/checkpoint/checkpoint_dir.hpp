#pragma once
// The checkpoint directory: DIR/step-<8 digits>/ per checkpoint; which are complete; writing
// a file so that a reader sees the old one or the whole new one, never a part.
//
// A save writes into its own staging directory (step-<8 digits>.saving-<save id>) and is
// published whole, by one rename, once complete: a step saved twice (a resume at step N then a
// save at N, a periodic and a preemption save of one step) replaces the first checkpoint in
// one atomic exchange, so a kill at any moment leaves the first or the second, never a mix.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dcp_metadata.hpp"

namespace ddp::checkpoint {

std::string step_dir(const std::string& dir, int64_t step);
// Where save `save_id` (the same on every rank) of `step` is written before it is published.
std::string staging_dir(const std::string& dir, int64_t step, int64_t save_id);
// Publishes a complete staging directory as `final_path`, replacing a checkpoint already
// there in one atomic exchange (renameat2 RENAME_EXCHANGE; on a file system without it, two
// renames: the old one moved aside to <staging>.old, then the new one in: a kill between them
// leaves the old one there, which complete_step_dirs lists and remove_incomplete moves back),
// then removes what it replaced and fsyncs the folder. Error naming the paths when it cannot.
void publish(const std::string& staging, const std::string& final_path);
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

// Complete checkpoints, newest first (a checkpoint a killed replace left moved aside counts as
// its step's); `skipped` gets "path: reason" for each incomplete one.
std::vector<StepDir> complete_step_dirs(const std::string& dir,
                                        std::vector<std::string>* skipped = nullptr);

// Writes a new temporary beside path (random name, exclusive, never through a link), fsyncs it,
// renames it to path and fsyncs the directory (ddp::write_file_atomically, the snapshots' own).
void write_file_atomically(const std::string& path, const std::string& bytes);

// Removes what a killed save left: step directories without .metadata and staging
// directories (published saves leave none), after moving a complete checkpoint a killed
// replace left aside back under its step's name. Called by rank 0 while no save is in flight,
// or with `below_step` for the steps before one it just published.
void remove_incomplete(const std::string& dir, std::optional<int64_t> below_step = std::nullopt);
// Removes all but the newest `keep` complete checkpoints.
void prune_complete(const std::string& dir, int keep);

}  // namespace ddp::checkpoint
