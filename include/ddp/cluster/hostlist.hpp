#pragma once
// SLURM host lists ("gpu[001-004,007]", "a[1-2],b3", "rack[1-2]-node[01-02]").
//
// Syntax accepted, following SLURM's own hostlist expansion:
// - Hosts are separated by commas (or whitespace) outside brackets.
// - A bracket holds comma-separated numbers or ranges "lo-hi" with lo <= hi; the width of lo
//   sets the zero padding of every number of that range ("[08-11]" -> 08 09 10 11,
//   "[8-11]" -> 8 9 10 11).
// - Several bracket groups in one name expand as a product, leftmost group outermost:
//   "r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2.
// - Empty entries ("a,,b") are skipped, as SLURM does.
// Rejected with a UsageError naming the list, the 1-based position and the fix: an empty
// list, unbalanced or nested brackets, empty brackets, reversed ranges, ranges with a step
// ("[1-9:2]" is not SLURM syntax), non-digits inside brackets, text after a name's last
// bracket group ("n[1-2]x", which SLURM rejects too), and more than kMaxHosts hosts.

#include <cstddef>
#include <string>
#include <vector>

namespace ddp::cluster {

// Upper bound on the hosts one list may expand to (SLURM's clusters are far smaller); keeps
// a typo such as "n[0-999999999]" from exhausting memory.
constexpr size_t kMaxHosts = 1 << 20;

// Expands a SLURM host list into host names, in list order, duplicates kept.
std::vector<std::string> expand_hostlist(const std::string& list);

// The inverse: a compact list that expand_hostlist() turns back into exactly `hosts`, in the
// same order. Adjacent hosts that differ only in a trailing number are merged into one
// bracket group ("gpu001,gpu002,gpu007" -> "gpu[001-002,007]"). Used in messages.
std::string compress_hostlist(const std::vector<std::string>& hosts);

}  // namespace ddp::cluster
