#include "ddp/torch/snapshot/torch_pickle.hpp"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "ddp/util/error.hpp"

namespace ddp {

namespace {

// A pickle value while the stream is being parsed. Dicts and lists are filled after they are
// created (SETITEMS, APPENDS) and may be shared through the memo, so values are reference
// counted nodes, converted to IValues at the end.
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
    kTensor,
    kMark
  };
  Kind kind = kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                   // str, bytes, global "module.name"
  std::vector<NodePtr> items;                      // tuple, list
  std::vector<std::pair<NodePtr, NodePtr>> pairs;  // dict, in insertion order
  torch::Tensor tensor;                            // storage (flat) or tensor
  // Containers: 1 + the deepest item when it was added (a lower bound once items nested in
  // this one grow later through the memo; the conversion's own limit catches those).
  uint32_t depth = 0;
  bool registered = false;  // in Parser::containers_ (torn down by the parser)
};

NodePtr make(Node::Kind k) {
  auto n = std::make_shared<Node>();
  n->kind = k;
  return n;
}

const char* kind_name(Node::Kind k) {
  static const char* names[] = {"None", "bool", "int",    "float",   "str",    "bytes", "tuple",
                                "list", "dict", "global", "storage", "tensor", "mark"};
  return names[k];
}

bool is_container(Node::Kind k) {
  return k == Node::kTuple || k == Node::kList || k == Node::kDict;
}

// Parses one pickle into Nodes. The Nodes stay owned by the parser until it is destroyed:
// values nested thousands deep (a crafted "((((...l" stream) or containing themselves (a list
// appended to itself through the memo) would otherwise be destroyed recursively, overflowing
// the stack, or never (a shared_ptr cycle).
class Parser {
 public:
  Parser(const uint8_t* p, size_t n, const StorageLoader& storages, const std::string& source)
      : p_(p), n_(n), storages_(storages), source_(source) {}
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;
  // Tears the values down without recursion: every container's items are moved out first, so
  // no Node's destructor finds another Node to destroy.
  ~Parser() {
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
    memo_.clear();
    stack_.clear();
    containers_.clear();
  }

  NodePtr run();

 private:
  UsageError fail(const std::string& what) const {
    return UsageError(
        fmt::format("{}: cannot read the torch.save pickle at byte {}: {}", source_, pos_, what));
  }
  const uint8_t* take(size_t k) {
    if (n_ - pos_ < k) throw fail(fmt::format("truncated ({} more bytes needed)", k));
    const uint8_t* r = p_ + pos_;
    pos_ += k;
    return r;
  }
  uint64_t le(size_t k) {
    const uint8_t* b = take(k);
    uint64_t v = 0;
    for (size_t j = 0; j < k; ++j) v |= uint64_t{b[j]} << (8 * j);
    return v;
  }
  std::string str(size_t k) {
    const uint8_t* b = take(k);
    return std::string(reinterpret_cast<const char*>(b), k);
  }
  std::string line() {
    const void* nl = std::memchr(p_ + pos_, '\n', n_ - pos_);
    if (!nl) throw fail("unterminated GLOBAL name");
    const size_t len = static_cast<const uint8_t*>(nl) - (p_ + pos_);
    std::string r = str(len);
    pos_ += 1;
    return r;
  }
  NodePtr pop() {
    if (stack_.empty()) throw fail("stack underflow");
    NodePtr r = stack_.back();
    stack_.pop_back();
    if (r->kind == Node::kMark) throw fail("unexpected MARK");
    return r;
  }
  NodePtr& top() {
    if (stack_.empty() || stack_.back()->kind == Node::kMark) throw fail("stack underflow");
    return stack_.back();
  }
  // The items pushed since the last MARK, which is removed.
  std::vector<NodePtr> pop_mark() {
    size_t m = stack_.size();
    while (m > 0 && stack_[m - 1]->kind != Node::kMark) --m;
    if (m == 0) throw fail("no MARK on the stack");
    std::vector<NodePtr> r(stack_.begin() + m, stack_.end());
    stack_.resize(m - 1);
    return r;
  }
  void push(NodePtr n) {
    if (stack_.size() > kMaxStack) throw fail("stack deeper than 100000 entries");
    if (is_container(n->kind) && !n->registered) {
      n->registered = true;
      containers_.push_back(n);
      for (const auto& x : n->items) deepen(*n, *x);
      for (const auto& kv : n->pairs) {
        deepen(*n, *kv.first);
        deepen(*n, *kv.second);
      }
    }
    stack_.push_back(std::move(n));
  }
  // `container` now holds `item`: bounds the nesting while parsing, at the limit the conversion
  // applies, so a deep stream fails at once with the byte where it went too deep.
  void deepen(Node& container, const Node& item) {
    container.depth = std::max(container.depth, item.depth + 1);
    if (container.depth > kMaxDepth) {
      throw fail(fmt::format("values nest deeper than {} levels", kMaxDepth));
    }
  }
  void memo_put(uint64_t id) {
    if (id > kMaxMemo) throw fail(fmt::format("memo index {} too large", id));
    memo_[id] = top();
  }
  NodePtr memo_get(uint64_t id) {
    auto it = memo_.find(id);
    if (it == memo_.end()) throw fail(fmt::format("memo index {} was never stored", id));
    return it->second;
  }
  void set_items(const NodePtr& dict, const std::vector<NodePtr>& kv) {
    if (dict->kind != Node::kDict)
      throw fail(std::string("SETITEMS on a ") + kind_name(dict->kind));
    if (kv.size() % 2) throw fail("odd number of items for a dict");
    for (size_t j = 0; j < kv.size(); j += 2) {
      dict->pairs.emplace_back(kv[j], kv[j + 1]);
      if (dict->registered) {
        deepen(*dict, *kv[j]);
        deepen(*dict, *kv[j + 1]);
      }
    }
  }
  void append(const NodePtr& list, const std::vector<NodePtr>& items) {
    if (list->kind != Node::kList) throw fail(std::string("APPEND on a ") + kind_name(list->kind));
    list->items.insert(list->items.end(), items.begin(), items.end());
    if (list->registered) {
      for (const auto& x : items) deepen(*list, *x);
    }
  }
  NodePtr tuple(std::vector<NodePtr> items) {
    auto t = make(Node::kTuple);
    t->items = std::move(items);
    return t;
  }
  NodePtr int_node(int64_t v) {
    auto n = make(Node::kInt);
    n->i = v;
    return n;
  }

  NodePtr persistent_load(const NodePtr& pid);
  NodePtr reduce(const NodePtr& callable, const NodePtr& args);
  NodePtr rebuild_tensor(const std::vector<NodePtr>& a);

  static constexpr size_t kMaxStack = 100000;
  static constexpr uint32_t kMaxDepth = 1000;  // as the conversion (Converter)
  static constexpr uint64_t kMaxMemo = 1u << 24;

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const StorageLoader& storages_;
  const std::string& source_;
  std::vector<NodePtr> stack_;
  std::unordered_map<uint64_t, NodePtr> memo_;
  std::map<std::string, torch::Tensor> storage_cache_;  // tensors sharing a storage share it
  std::vector<NodePtr> containers_;                     // every container pushed (see ~Parser)
};

NodePtr Parser::run() {
  for (;;) {
    const uint8_t op = *take(1);
    switch (op) {
      case 0x80:
        take(1);
        break;  // PROTO
      case 0x95:
        take(8);
        break;     // FRAME (protocol 4): frames are only a read-ahead hint
      case '.': {  // STOP
        NodePtr r = pop();
        if (!stack_.empty()) throw fail("values left on the stack at STOP");
        return r;
      }
      case '(':
        push(make(Node::kMark));
        break;
      case '0':
        pop();
        break;
      case '1':
        pop_mark();
        break;
      case '2':
        push(top());
        break;
      case '}':
        push(make(Node::kDict));
        break;
      case ']':
        push(make(Node::kList));
        break;
      case ')':
        push(make(Node::kTuple));
        break;
      case 'd': {
        auto d = make(Node::kDict);
        set_items(d, pop_mark());
        push(d);
        break;
      }
      case 'l': {
        auto l = make(Node::kList);
        l->items = pop_mark();
        push(l);
        break;
      }
      case 't':
        push(tuple(pop_mark()));
        break;
      case 0x85: {
        auto a = pop();
        push(tuple({a}));
        break;
      }
      case 0x86: {
        auto b = pop(), a = pop();
        push(tuple({a, b}));
        break;
      }
      case 0x87: {
        auto c = pop(), b = pop(), a = pop();
        push(tuple({a, b, c}));
        break;
      }
      case 's': {
        auto v = pop(), k = pop();
        set_items(top(), {k, v});
        break;
      }
      case 'u': {
        auto kv = pop_mark();
        set_items(top(), kv);
        break;
      }
      case 'a': {
        auto v = pop();
        append(top(), {v});
        break;
      }
      case 'e': {
        auto items = pop_mark();
        append(top(), items);
        break;
      }
      case 'N':
        push(make(Node::kNone));
        break;
      case 0x88:
      case 0x89: {
        auto n = make(Node::kBool);
        n->b = op == 0x88;
        push(n);
        break;
      }
      case 'J':
        push(int_node(static_cast<int32_t>(le(4))));
        break;
      case 'K':
        push(int_node(static_cast<int64_t>(le(1))));
        break;
      case 'M':
        push(int_node(static_cast<int64_t>(le(2))));
        break;
      case 0x8a:    // LONG1
      case 0x8b: {  // LONG4
        const uint64_t len = op == 0x8a ? le(1) : le(4);
        if (len > 8) throw fail(fmt::format("integer of {} bytes does not fit 64 bits", len));
        uint64_t v = len ? le(len) : 0;
        if (len > 0 && len < 8 && (v >> (8 * len - 1)) & 1) v |= ~uint64_t{0} << (8 * len);
        push(int_node(static_cast<int64_t>(v)));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        const uint8_t* b = take(8);
        uint64_t bits = 0;
        for (int j = 0; j < 8; ++j) bits = (bits << 8) | b[j];
        auto n = make(Node::kFloat);
        std::memcpy(&n->f, &bits, 8);
        push(n);
        break;
      }
      case 'X':     // BINUNICODE
      case 0x8c:    // SHORT_BINUNICODE
      case 0x8d:    // BINUNICODE8
      case 'T':     // BINSTRING
      case 'U':     // SHORT_BINSTRING
      case 'B':     // BINBYTES
      case 'C':     // SHORT_BINBYTES
      case 0x8e: {  // BINBYTES8
        const size_t width = (op == 0x8c || op == 'U' || op == 'C') ? 1
                             : (op == 0x8d || op == 0x8e)           ? 8
                                                                    : 4;
        const uint64_t len = le(width);
        if (len > n_ - pos_) throw fail(fmt::format("string of {} bytes runs past the end", len));
        auto n = make((op == 'B' || op == 'C' || op == 0x8e) ? Node::kBytes : Node::kStr);
        n->s = str(len);
        push(n);
        break;
      }
      case 'c': {  // GLOBAL
        auto g = make(Node::kGlobal);
        const std::string module = line();
        g->s = module + "." + line();
        push(g);
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        auto name = pop(), module = pop();
        if (name->kind != Node::kStr || module->kind != Node::kStr) throw fail("bad STACK_GLOBAL");
        auto g = make(Node::kGlobal);
        g->s = module->s + "." + name->s;
        push(g);
        break;
      }
      case 'R': {
        auto args = pop(), callable = pop();
        push(reduce(callable, args));
        break;
      }
      case 'b': {  // BUILD: an OrderedDict's _metadata or a Parameter's state; not needed
        pop();
        top();
        break;
      }
      case 'Q': {
        auto pid = pop();
        push(persistent_load(pid));
        break;
      }
      case 'q':
        memo_put(le(1));
        break;
      case 'r':
        memo_put(le(4));
        break;
      case 0x94:
        memo_put(memo_.size());
        break;  // MEMOIZE
      case 'h':
        push(memo_get(le(1)));
        break;
      case 'j':
        push(memo_get(le(4)));
        break;
      default:
        throw fail(
            fmt::format("unsupported pickle opcode 0x{:02x}; save with torch.save's "
                        "default protocol",
                        op));
    }
  }
}

torch::ScalarType storage_dtype(const std::string& global) {
  static const std::map<std::string, torch::ScalarType> types = {
      {"torch.FloatStorage", torch::kFloat},
      {"torch.DoubleStorage", torch::kDouble},
      {"torch.HalfStorage", torch::kHalf},
      {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kLong},
      {"torch.IntStorage", torch::kInt},
      {"torch.ShortStorage", torch::kShort},
      {"torch.CharStorage", torch::kChar},
      {"torch.ByteStorage", torch::kByte},
      {"torch.BoolStorage", torch::kBool},
      {"torch.ComplexFloatStorage", torch::kComplexFloat},
      {"torch.ComplexDoubleStorage", torch::kComplexDouble},
  };
  auto it = types.find(global);
  return it == types.end() ? torch::ScalarType::Undefined : it->second;
}

// ('storage', torch.XStorage, key, location, numel): the flat storage in record data/<key>.
NodePtr Parser::persistent_load(const NodePtr& pid) {
  if (pid->kind != Node::kTuple || pid->items.size() != 5 || pid->items[0]->kind != Node::kStr ||
      pid->items[0]->s != "storage" || pid->items[1]->kind != Node::kGlobal ||
      pid->items[2]->kind != Node::kStr || pid->items[4]->kind != Node::kInt) {
    throw fail("persistent id is not ('storage', type, key, location, numel)");
  }
  const torch::ScalarType dtype = storage_dtype(pid->items[1]->s);
  if (dtype == torch::ScalarType::Undefined) {
    throw fail("unknown storage type " + pid->items[1]->s);
  }
  const std::string& key = pid->items[2]->s;
  const int64_t numel = pid->items[4]->i;
  auto node = make(Node::kStorage);
  auto cached = storage_cache_.find(key);
  if (cached != storage_cache_.end()) {
    node->tensor = cached->second;
    return node;
  }
  const std::vector<uint8_t> bytes = storages_(key);
  const size_t elem = c10::elementSize(dtype);
  if (numel < 0 || bytes.size() / elem < static_cast<uint64_t>(numel)) {
    throw fail(fmt::format("storage data/{} holds {} bytes, fewer than {} elements of {} bytes",
                           key, bytes.size(), numel, elem));
  }
  node->tensor = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
  if (numel > 0) std::memcpy(node->tensor.data_ptr(), bytes.data(), numel * elem);
  storage_cache_[key] = node->tensor;
  return node;
}

NodePtr Parser::rebuild_tensor(const std::vector<NodePtr>& a) {
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks, ...)
  if (a.size() < 4 || a[0]->kind != Node::kStorage || a[1]->kind != Node::kInt ||
      a[2]->kind != Node::kTuple || a[3]->kind != Node::kTuple) {
    throw fail("_rebuild_tensor arguments are not (storage, offset, size, stride, ...)");
  }
  std::vector<int64_t> size, stride;
  for (auto& x : a[2]->items) {
    if (x->kind != Node::kInt || x->i < 0) throw fail("tensor size is not a tuple of ints >= 0");
    size.push_back(x->i);
  }
  for (auto& x : a[3]->items) {
    if (x->kind != Node::kInt || x->i < 0) throw fail("tensor stride is not a tuple of ints >= 0");
    stride.push_back(x->i);
  }
  if (size.size() != stride.size()) throw fail("tensor size and stride differ in length");
  const torch::Tensor& storage = a[0]->tensor;
  const int64_t offset = a[1]->i;
  // The last element addressed must lie inside the storage (an empty tensor addresses none).
  // Every product and sum is checked: sizes, strides and offset are untrusted int64s, and a
  // wrapped bound would let the view reach outside its storage.
  auto geometry = [&] {
    return fmt::format("size [{}] stride [{}] at offset {}", fmt::join(size, ", "),
                       fmt::join(stride, ", "), offset);
  };
  if (offset < 0) throw fail(fmt::format("tensor of {}: negative offset", geometry()));
  bool empty = false;
  int64_t last = offset, numel = 1;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 0) empty = true;
    int64_t extent = 0;
    if (__builtin_mul_overflow(numel, size[d], &numel) ||
        (size[d] > 0 && (__builtin_mul_overflow(size[d] - 1, stride[d], &extent) ||
                         __builtin_add_overflow(last, extent, &last)))) {
      throw fail(
          fmt::format("tensor of {}: its element count or extent overflows int64", geometry()));
    }
  }
  if (!empty && last >= storage.numel()) {
    throw fail(fmt::format("tensor of {} exceeds its storage of {} elements", geometry(),
                           storage.numel()));
  }
  auto n = make(Node::kTensor);
  n->tensor =
      empty ? torch::empty(size, storage.options()) : storage.as_strided(size, stride, offset);
  return n;
}

NodePtr Parser::reduce(const NodePtr& callable, const NodePtr& args) {
  if (callable->kind != Node::kGlobal) throw fail("REDUCE of a non-global callable");
  if (args->kind != Node::kTuple) throw fail("REDUCE arguments are not a tuple");
  const std::string& g = callable->s;
  const auto& a = args->items;
  if (g == "collections.OrderedDict") {
    if (!a.empty()) throw fail("OrderedDict with constructor arguments");
    return make(Node::kDict);
  }
  if (g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_tensor") {
    return rebuild_tensor(a);
  }
  if (g == "torch._utils._rebuild_parameter" || g == "torch._utils._rebuild_parameter_with_state") {
    if (a.empty() || a[0]->kind != Node::kTensor) throw fail("Parameter without a tensor");
    return a[0];
  }
  // LibTorch's own pickler (torch::pickle_save) tags typed containers; Python's torch.load
  // treats these as identity functions on the container.
  if (g == "torch.jit._pickle.restore_type_tag" || g == "torch.jit._pickle.build_intlist" ||
      g == "torch.jit._pickle.build_tensorlist" || g == "torch.jit._pickle.build_doublelist" ||
      g == "torch.jit._pickle.build_boollist") {
    if (a.empty()) throw fail(g + " without an argument");
    return a[0];
  }
  if (g == "torch.device") {
    if (a.empty() || a[0]->kind != Node::kStr) throw fail("torch.device without a name");
    auto s = make(Node::kStr);
    s->s = a[0]->s;
    if (a.size() > 1 && a[1]->kind == Node::kInt) s->s += ":" + std::to_string(a[1]->i);
    return s;
  }
  if (g == "_codecs.encode") {  // protocol 2's spelling of bytes: encode(str, 'latin1')
    if (a.size() != 2 || a[0]->kind != Node::kStr) throw fail("bad _codecs.encode");
    auto b = make(Node::kBytes);
    // The str is the bytes as latin-1 code points, stored as UTF-8: decode back.
    const std::string& u = a[0]->s;
    for (size_t j = 0; j < u.size(); ++j) {
      const uint8_t c = u[j];
      if (c < 0x80) {
        b->s.push_back(static_cast<char>(c));
      } else if ((c & 0xE0) == 0xC0 && j + 1 < u.size()) {
        b->s.push_back(static_cast<char>(((c & 0x1F) << 6) | (u[++j] & 0x3F)));
      } else {
        throw fail("_codecs.encode of a non-latin-1 string");
      }
    }
    return b;
  }
  throw fail(
      fmt::format("the file needs the Python global {}, which a C++ reader cannot "
                  "construct; save plain containers and tensors (e.g. "
                  "model.state_dict())",
                  g));
}

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

c10::IValue parse_torch_pickle(const uint8_t* bytes, size_t size, const StorageLoader& storages,
                               const std::string& source) {
  Parser parser(bytes, size, storages, source);
  NodePtr root = parser.run();
  return Converter(source)(root, 0);
}

c10::IValue torch_load_bytes(const std::vector<char>& zip, const std::string& source) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(zip.data(), zip.size()));
  } catch (const c10::Error& e) {
    throw UsageError(
        fmt::format("{}: not a torch.save zip archive ({}); is it truncated or a "
                    "legacy (pre-1.6) torch.save file?",
                    source, e.what_without_backtrace()));
  }
  auto record = [&](const std::string& name) {
    try {
      at::DataPtr data;
      size_t n = 0;
      std::tie(data, n) = reader->getRecord(name);
      const auto* p = static_cast<const uint8_t*>(data.get());
      return std::vector<uint8_t>(p, p + n);
    } catch (const c10::Error& e) {
      throw UsageError(fmt::format("{}: cannot read record {} of the zip archive: {}", source, name,
                                   e.what_without_backtrace()));
    }
  };
  const std::vector<uint8_t> pkl = record("data.pkl");
  return parse_torch_pickle(
      pkl.data(), pkl.size(), [&](const std::string& key) { return record("data/" + key); },
      source);
}

}  // namespace ddp
