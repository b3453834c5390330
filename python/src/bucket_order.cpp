// PyTorch's DDP lays gradients out in buckets and all-reduces bucket 0 first. After the first
// backward it rebuilds the layout in the order the gradients became ready (the last layers
// first), so the first buckets are all-reduced while the backward of the first layers still
// runs. ddp.StepManager cannot keep that order: a replacement's new DDP and the survivors' must
// sum the same parameters position by position, in every run alike, so it rebuilds the layout
// itself on every rank at the start and at each heal. Python only offers a rebuild in parameter
// order (`Reducer._push_all_rebuilt_params`), which puts the first layers, whose gradients come
// last, in bucket 0: no all-reduce could start before the backward ended (+3 % a step on a CNN
// at world 2, bench/fault/bucket_layout.py). Reverse parameter order is what a sequential
// model's backward produces, and it is the same on every rank without any exchange.

#include "bucket_order.hpp"

#include <mutex>

#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace py = pybind11;

namespace ddp::python {
namespace {

// The Reducer pushes the parameters of its next rebuild, in the order of that rebuild, with a
// protected method under its protected lock. A class derived from it may form pointers to
// them; nothing else is reached, and no object of this type is ever made.
struct ReverseOrderPush : c10d::Reducer {
  // Reducer::push_rebuilt_params_for_all_indices, last parameter first: it pushes nothing where
  // the Reducer will not rebuild (it has rebuilt since its last reset, or finds unused
  // parameters without a static graph) or a backward has pushed already.
  static void push(c10d::Reducer& reducer) {
    std::lock_guard<std::mutex> lock(reducer.*(&ReverseOrderPush::mutex_));
    if (!reducer.should_rebuild_buckets() ||
        !(reducer.*(&ReverseOrderPush::rebuilt_param_indices_)).empty()) {
      return;
    }
    const auto push_one = &ReverseOrderPush::push_rebuilt_params;
    for (size_t index = (reducer.*(&ReverseOrderPush::params_)).size(); index-- > 0;) {
      (reducer.*push_one)(index);
    }
  }
};

}  // namespace

void bind_bucket_order(py::module& m) {
  m.def(
      "_push_params_in_reverse_order",
      [](c10d::Reducer& reducer) { ReverseOrderPush::push(reducer); }, py::arg("reducer"),
      "What Reducer._push_all_rebuilt_params does, in reverse parameter order: the next "
      "Reducer._rebuild_buckets lays the buckets out as if the backward had produced the "
      "gradients from the last parameter to the first. Call it between steps, never while a "
      "backward runs.");
}

}  // namespace ddp::python
