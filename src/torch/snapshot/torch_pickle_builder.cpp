#include "torch_pickle_builder.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::torch_pickle {

// Tears the values down without recursion: every container's items are moved out first, so no
// Node's destructor finds another Node to destroy.
TorchPickleBuilder::~TorchPickleBuilder() {
  std::vector<NodePtr> detached;
  for (auto& c : containers_) {
    for (auto& x : c->items) detached.push_back(std::move(x));
    for (auto& kv : c->pairs) {
      detached.push_back(std::move(kv.first));
      detached.push_back(std::move(kv.second));
    }
    c->items.clear();
    c->pairs.clear();
  }
  detached.clear();
  containers_.clear();
}

UsageError TorchPickleBuilder::unsupported(uint8_t code) const {
  return in_.fail(fmt::format(
      "unsupported pickle opcode 0x{:02x}; save with torch.save's default protocol", code));
}

NodePtr TorchPickleBuilder::boolean(bool b) {
  auto n = make(Node::kBool);
  n->b = b;
  return n;
}

NodePtr TorchPickleBuilder::integer(int64_t i) {
  auto n = make(Node::kInt);
  n->i = i;
  return n;
}

NodePtr TorchPickleBuilder::real(double f) {
  auto n = make(Node::kFloat);
  n->f = f;
  return n;
}

NodePtr TorchPickleBuilder::with_string(Node::Kind kind, std::string s) {
  auto n = make(kind);
  n->s = std::move(s);
  return n;
}

NodePtr TorchPickleBuilder::tuple(std::vector<NodePtr> items) {
  auto t = make(Node::kTuple);
  t->items = std::move(items);
  return t;
}

NodePtr TorchPickleBuilder::list(std::vector<NodePtr> items) {
  auto l = make(Node::kList);
  l->items = std::move(items);
  return l;
}

NodePtr TorchPickleBuilder::stack_global(const NodePtr& module, const NodePtr& name) {
  if (name->kind != Node::kStr || module->kind != Node::kStr) throw in_.fail("bad STACK_GLOBAL");
  return global(module->s + "." + name->s);
}

void TorchPickleBuilder::set_items(const NodePtr& dict, const std::vector<NodePtr>& kv,
                                   const char* /*op*/) {
  if (dict->kind != Node::kDict) {
    throw in_.fail(std::string("SETITEMS on a ") + kind_name(dict->kind));
  }
  if (kv.size() % 2) throw in_.fail("odd number of items for a dict");
  for (size_t j = 0; j < kv.size(); j += 2) {
    dict->pairs.emplace_back(kv[j], kv[j + 1]);
    if (dict->registered) {
      deepen(*dict, *kv[j]);
      deepen(*dict, *kv[j + 1]);
    }
  }
}

void TorchPickleBuilder::append(const NodePtr& list, const std::vector<NodePtr>& items,
                                const char* /*op*/) {
  if (list->kind != Node::kList) {
    throw in_.fail(std::string("APPEND on a ") + kind_name(list->kind));
  }
  list->items.insert(list->items.end(), items.begin(), items.end());
  if (list->registered) {
    for (const auto& x : items) deepen(*list, *x);
  }
}

void TorchPickleBuilder::pushed(const NodePtr& n) {
  if (!is_container(n->kind) || n->registered) return;
  n->registered = true;
  containers_.push_back(n);
  for (const auto& x : n->items) deepen(*n, *x);
  for (const auto& kv : n->pairs) {
    deepen(*n, *kv.first);
    deepen(*n, *kv.second);
  }
}

void TorchPickleBuilder::deepen(Node& container, const Node& item) {
  container.depth = std::max(container.depth, item.depth + 1);
  if (container.depth > kMaxDepth) {
    throw in_.fail(fmt::format("values nest deeper than {} levels", kMaxDepth));
  }
}

}  // namespace ddp::torch_pickle
