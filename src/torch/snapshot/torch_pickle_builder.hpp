#pragma once
// The values of a torch.save pickle, built for the one pickle parser (pickle/unpickler.hpp):
// plain values, containers, and what torch.save's globals and persistent ids stand for
// (torch_pickle_globals.cpp): storages read from the archive, tensors viewing them,
// nn.Parameter as its tensor, torch.device as its string. Any other global is refused: no code
// from the file is ever run.
//
// The builder owns every container it saw until it is destroyed: values nested thousands deep
// (a crafted "((((...l" stream) or containing themselves (a list appended to itself through
// the memo) would otherwise be destroyed recursively, overflowing the stack, or never (a
// shared_ptr cycle).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../pickle/unpickler.hpp"
#include "ddp/torch/snapshot/torch_pickle.hpp"
#include "pickle_node.hpp"

namespace ddp::torch_pickle {

class TorchPickleBuilder {
 public:
  using Value = NodePtr;
  static constexpr size_t kMaxStack = 100000;
  static constexpr uint32_t kMaxDepth = 1000;  // as the conversion (pickle_to_ivalue.hpp)
  static constexpr uint64_t kMaxMemo = 1u << 24;

  TorchPickleBuilder(pickle::Cursor& in, const StorageLoader& storages)
      : in_(in), storages_(storages) {}
  TorchPickleBuilder(const TorchPickleBuilder&) = delete;
  TorchPickleBuilder& operator=(const TorchPickleBuilder&) = delete;
  ~TorchPickleBuilder();

  // Everything torch.save's default protocol (2) writes; NEWOBJ it never does.
  bool supports(uint8_t code) const { return code != pickle::op::kNewObj; }
  UsageError unsupported(uint8_t code) const;

  Value none() { return make(Node::kNone); }
  Value boolean(bool b);
  Value integer(int64_t i);
  Value real(double f);
  Value text(std::string s) { return with_string(Node::kStr, std::move(s)); }
  Value bytes(std::string s) { return with_string(Node::kBytes, std::move(s)); }
  Value global(std::string dotted) { return with_string(Node::kGlobal, std::move(dotted)); }
  Value tuple(std::vector<Value> items);
  Value list(std::vector<Value> items);
  Value dict() { return make(Node::kDict); }
  Value stack_global(const Value& module, const Value& name);
  void set_items(const Value& dict, const std::vector<Value>& kv, const char* op);
  void append(const Value& list, const std::vector<Value>& items, const char* op);
  // BUILD: an OrderedDict's _metadata or a Parameter's state; neither is needed.
  void build(const Value&, const Value&) {}
  void pushed(const Value& v);

  // torch_pickle_globals.cpp
  Value reduce(const Value& callable, const Value& args);
  Value newobj(const Value&, const Value&) { throw unsupported(pickle::op::kNewObj); }
  Value persistent_load(const Value& pid);

 private:
  Value with_string(Node::Kind kind, std::string s);
  // `container` now holds `item`: bounds the nesting while parsing, at the limit the conversion
  // applies, so a deep stream fails at once with the byte where it went too deep.
  void deepen(Node& container, const Node& item);
  Value rebuild_tensor(const std::vector<Value>& a);

  pickle::Cursor& in_;
  const StorageLoader& storages_;
  std::map<std::string, at::Tensor> storage_cache_;  // tensors sharing a storage share it
  std::vector<NodePtr> containers_;                  // every container pushed (see above)
};

}  // namespace ddp::torch_pickle
