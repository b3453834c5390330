#pragma once
// ddp._C._RecoveryMembership: the membership generations of `ddprun --recovery step` for
// ddp.StepManager on PyTorch's own backends (gloo, nccl: python/ddp/torch_generations.py). A
// ddp::RecoverableGroup with membership_only: ddp watches ddprun's notices and says who is in
// each generation; the Python side forms PyTorch's group of each generation itself.

#include <pybind11/pybind11.h>

namespace ddp::python {

void bind_recovery_membership(pybind11::module& m);

}  // namespace ddp::python
