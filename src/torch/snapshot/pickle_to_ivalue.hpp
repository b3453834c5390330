#pragma once
// The parsed values of a torch.save pickle (pickle_node.hpp) as one c10::IValue: dicts become
// GenericDicts (string or int keys), lists and tuples GenericLists and Tuples, tensors stay
// the CPU tensors the parse made. Values shared through the memo stay shared; a value that
// contains itself, a bare global or storage, or a dict with other keys is a UsageError naming
// `source`.

#include <ATen/core/ivalue.h>

#include <string>

#include "pickle_node.hpp"

namespace ddp::torch_pickle {

c10::IValue to_ivalue(const NodePtr& root, const std::string& source);

}  // namespace ddp::torch_pickle
