#pragma once
// One rank's part of a save, and rank 0's commit.
//
// Each rank writes its items into <step dir>/__<rank>_0.distcp (one torch.save archive per
// item, back to back, as DCP's FileSystemWriter does), syncs it, then publishes what it wrote
// in <step dir>/__<rank>.ddp-shard (its part of the metadata, written atomically). Rank 0
// waits for every rank's report, merges them into .metadata (written atomically: the
// checkpoint is complete from that moment), and removes the reports.

#include <chrono>
#include <string>
#include <vector>

#include "dcp_metadata.hpp"
#include "state_items.hpp"

namespace ddp::checkpoint {

// Writes the items and this rank's report. Tensors must be CPU tensors.
void write_shard(const std::string& step_path, int rank, const std::vector<Item>& items);

// Rank 0: waits up to `timeout` for all `world` reports, then writes .metadata. TimeoutError
// naming the ranks whose shards are missing.
void commit(const std::string& step_path, int world, std::chrono::milliseconds timeout);

}  // namespace ddp::checkpoint
