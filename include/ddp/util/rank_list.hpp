#pragma once
// Rank sets in messages: runs collapse, so a report over 1024 ranks stays one short line.

#include <string>
#include <vector>

namespace ddp {

// "0", "0-3", "2-4, 7" for ranks in ascending order (each run of consecutive ranks becomes
// "first-last", runs joined by `separator`: "," gives the kernel's CPU list format); "" for none.
std::string format_rank_list(const std::vector<int>& ranks, const std::string& separator = ", ");

}  // namespace ddp
