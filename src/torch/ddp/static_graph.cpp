#include "static_graph.hpp"

#include <fmt/format.h>

#include "ddp/util/error.hpp"

namespace ddp {

void StaticGraph::finish_counting() {
  counting_ = false;
  unused_.clear();
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (counts_[i] == 0) unused_.push_back(i);
  }
  remaining_ = counts_;
}

bool StaticGraph::arrive(size_t index, const std::vector<std::string>& names, int rank,
                         int64_t iteration) {
  if (counts_[index] == 0) {
    throw UsageError(fmt::format(
        "DDP static_graph: parameter '{}' received a gradient in iteration {} on rank {} but "
        "none in the first iteration: the autograd graph changed, which static_graph(true) "
        "promised it would not. Turn static_graph off (with find_unused_parameters(true) for "
        "parameters used only in some iterations)",
        names[index], iteration, rank));
  }
  if (remaining_[index] == 0) {
    throw UsageError(fmt::format(
        "DDP static_graph: parameter '{}' received more gradients in iteration {} on rank {} "
        "than the {} of the first iteration: the autograd graph changed, which "
        "static_graph(true) promised it would not. Turn static_graph off",
        names[index], iteration, rank, counts_[index]));
  }
  return --remaining_[index] == 0;
}

std::vector<std::string> StaticGraph::incomplete(const std::vector<std::string>& names) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < remaining_.size(); ++i) {
    if (remaining_[i] > 0) {
      out.push_back(
          fmt::format("'{}' ({} of {})", names[i], counts_[i] - remaining_[i], counts_[i]));
    }
  }
  return out;
}

}  // namespace ddp
