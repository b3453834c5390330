#include "pickle_to_ivalue.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ddp/util/error.hpp"

namespace ddp::torch_pickle {
namespace {

// Converts the parsed nodes to IValues. A node reached again through the memo (pickle's BINGET,
// DUP) is converted once and shared, as Python's unpickler shares the object: a crafted file
// that references one container or string millions of times costs one conversion and one copy,
// not one per reference (a 181-byte file of memo-shared empty dicts took 4 GB before; a 3 KB
// string referenced 10^7 times would have been copied 10^7 times). A node reached again while
// it is being converted contains itself: refused, since an IValue cannot hold a cycle.
class Converter {
 public:
  explicit Converter(std::string source) : source_(std::move(source)) {}

  c10::IValue operator()(const NodePtr& n, int depth) {
    if (depth > 1000) throw UsageError(source_ + ": torch.save pickle nests deeper than 1000");
    const bool shareable = n->kind == Node::kStr || n->kind == Node::kBytes ||
                           n->kind == Node::kTuple || n->kind == Node::kList ||
                           n->kind == Node::kDict;
    if (!shareable) return convert(*n, depth);
    if (auto it = done_.find(n.get()); it != done_.end()) return it->second;
    if (!active_.insert(n.get()).second) {
      throw UsageError(
          fmt::format("{}: a {} contains itself (through the pickle memo); a C++ "
                      "value cannot hold a cycle",
                      source_, kind_name(n->kind)));
    }
    c10::IValue v = convert(*n, depth);
    active_.erase(n.get());
    done_.emplace(n.get(), v);
    return v;
  }

 private:
  c10::IValue convert(const Node& n, int depth) {
    // Every node is converted once, so this bounds the work by the nodes the input created.
    if (--budget_ < 0) throw UsageError(source_ + ": torch.save pickle holds over 10^7 values");
    switch (n.kind) {
      case Node::kNone:
        return c10::IValue();
      case Node::kBool:
        return c10::IValue(n.b);
      case Node::kInt:
        return c10::IValue(n.i);
      case Node::kFloat:
        return c10::IValue(n.f);
      case Node::kStr:
      case Node::kBytes:
        return c10::IValue(n.s);
      case Node::kTensor:
        return c10::IValue(n.tensor);
      case Node::kTuple: {
        std::vector<c10::IValue> items;
        for (auto& x : n.items) items.push_back((*this)(x, depth + 1));
        return c10::ivalue::Tuple::create(std::move(items));
      }
      case Node::kList: {
        c10::impl::GenericList list(c10::AnyType::get());
        for (auto& x : n.items) list.push_back((*this)(x, depth + 1));
        return list;
      }
      case Node::kDict: {
        bool all_int = !n.pairs.empty();
        for (auto& kv : n.pairs) {
          if (kv.first->kind == Node::kInt) continue;
          all_int = false;
          if (kv.first->kind != Node::kStr) {
            throw UsageError(
                fmt::format("{}: dict key of type {}; only str and int keys are "
                            "supported",
                            source_, kind_name(kv.first->kind)));
          }
        }
        if (!all_int) {
          for (auto& kv : n.pairs) {
            if (kv.first->kind != Node::kStr) {
              throw UsageError(source_ + ": dict mixes int and str keys");
            }
          }
        }
        c10::impl::GenericDict dict(
            all_int ? c10::TypePtr(c10::IntType::get()) : c10::TypePtr(c10::StringType::get()),
            c10::AnyType::get());
        for (auto& kv : n.pairs) {
          // Keys through the memo too: one string shared by every dict that uses it.
          dict.insert_or_assign((*this)(kv.first, depth + 1), (*this)(kv.second, depth + 1));
        }
        return dict;
      }
      default:
        throw UsageError(
            fmt::format("{}: a bare {} cannot be a value", source_, kind_name(n.kind)));
    }
  }

  std::string source_;
  int64_t budget_ = 10000000;
  std::unordered_map<const Node*, c10::IValue> done_;
  std::unordered_set<const Node*> active_;
};

}  // namespace

c10::IValue to_ivalue(const NodePtr& root, const std::string& source) {
  return Converter(source)(root, 0);
}

}  // namespace ddp::torch_pickle
