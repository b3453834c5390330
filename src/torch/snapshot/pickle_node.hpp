#pragma once
// A value of a torch.save pickle while the stream is being parsed (torch_pickle_builder.hpp)
// and before it becomes a c10::IValue (pickle_to_ivalue.hpp). Dicts and lists are filled after
// they are created (SETITEMS, APPENDS) and may be shared through the memo, so values are
// reference-counted nodes, converted at the end.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::torch_pickle {

struct Node;
using NodePtr = std::shared_ptr<Node>;

struct Node {
  enum Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kStorage,
    kTensor
  };
  Kind kind = kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                   // str, bytes, global "module.name"
  std::vector<NodePtr> items;                      // tuple, list
  std::vector<std::pair<NodePtr, NodePtr>> pairs;  // dict, in insertion order
  at::Tensor tensor;                               // storage (flat) or tensor
  // Containers: 1 + the deepest item when it was added (a lower bound once items nested in
  // this one grow later through the memo; the conversion's own limit catches those).
  uint32_t depth = 0;
  bool registered = false;  // in the builder's containers (torn down by the builder)
};

inline NodePtr make(Node::Kind k) {
  auto n = std::make_shared<Node>();
  n->kind = k;
  return n;
}

inline const char* kind_name(Node::Kind k) {
  static const char* names[] = {"None",  "bool", "int",  "float",  "str",     "bytes",
                                "tuple", "list", "dict", "global", "storage", "tensor"};
  return names[k];
}

inline bool is_container(Node::Kind k) {
  return k == Node::kTuple || k == Node::kList || k == Node::kDict;
}

}  // namespace ddp::torch_pickle
