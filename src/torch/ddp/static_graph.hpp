#pragma once
// StaticGraph: the Reducer's bookkeeping for DistributedDataParallelOptions::static_graph.
//
// The user promises that every iteration runs the same autograd graph. The first synchronized
// backward therefore only counts how often each parameter's gradient hook fires (a parameter
// used twice in forward, or inside a reentrant backward such as activation checkpointing, fires
// more than once; an unused one never). From the second synchronized backward on, a parameter
// is ready for its bucket when its hook has fired as often as in the first one, and the
// parameters that never fired are the (fixed) unused set: no graph search is needed.
// A hook firing more often than counted, or for a parameter that never fired in the first
// backward, is a UsageError naming it; so is a backward that ends with fewer firings.
//
// Not thread-safe: the Reducer calls it under its mutex.

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

class StaticGraph {
 public:
  explicit StaticGraph(size_t parameters) : counts_(parameters, 0), remaining_(parameters, 0) {}

  // True until the first synchronized backward has ended.
  bool counting() const { return counting_; }
  // First backward: one more firing of parameter `index`.
  void count(size_t index) { ++counts_[index]; }
  // End of the first backward: the counts become the expectation of every later backward.
  void finish_counting();

  // Later backwards: a firing of `index`. Returns true when it is the last one expected (the
  // gradient is complete); throws UsageError (naming `names[index]`, `rank`, `iteration`) when
  // the graph changed.
  bool arrive(size_t index, const std::vector<std::string>& names, int rank, int64_t iteration);
  // Start of a later backward: every parameter expects its full count again.
  void reset() { remaining_ = counts_; }

  // Parameters whose hook did not fire in the first backward.
  const std::vector<size_t>& unused() const { return unused_; }
  // After a later backward: "'name' (k of n)" for each parameter that got fewer firings than
  // in the first backward; empty when the graph was the same.
  std::vector<std::string> incomplete(const std::vector<std::string>& names) const;

 private:
  bool counting_ = true;
  std::vector<int64_t> counts_;     // firings per parameter in the first backward
  std::vector<int64_t> remaining_;  // firings still expected in this backward
  std::vector<size_t> unused_;
};

}  // namespace ddp
