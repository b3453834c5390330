#pragma once
// ddp._C._push_params_in_reverse_order: the gradient bucket layout of ddp.StepManager
// (python/ddp/recovery.py, StepManager._same_buckets).

#include <pybind11/pybind11.h>

namespace ddp::python {

void bind_bucket_order(pybind11::module& m);

}  // namespace ddp::python
