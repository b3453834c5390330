// What torch.save's globals and persistent ids stand for: REDUCE of torch's rebuild functions
// (tensors with offsets, strides and shared storages; nn.Parameter; torch.device; bytes as
// protocol 2 spells them) and BINPERSID of a storage record of the archive. Sizes, strides and
// offsets are untrusted: every view is checked to lie inside its storage.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cstring>

#include "torch_pickle_builder.hpp"

namespace ddp::torch_pickle {
namespace {

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

}  // namespace

// ('storage', torch.XStorage, key, location, numel): the flat storage in record data/<key>.
NodePtr TorchPickleBuilder::persistent_load(const NodePtr& pid) {
  if (pid->kind != Node::kTuple || pid->items.size() != 5 || pid->items[0]->kind != Node::kStr ||
      pid->items[0]->s != "storage" || pid->items[1]->kind != Node::kGlobal ||
      pid->items[2]->kind != Node::kStr || pid->items[4]->kind != Node::kInt) {
    throw in_.fail("persistent id is not ('storage', type, key, location, numel)");
  }
  const torch::ScalarType dtype = storage_dtype(pid->items[1]->s);
  if (dtype == torch::ScalarType::Undefined) {
    throw in_.fail("unknown storage type " + pid->items[1]->s);
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
    throw in_.fail(fmt::format("storage data/{} holds {} bytes, fewer than {} elements of {} bytes",
                               key, bytes.size(), numel, elem));
  }
  node->tensor = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
  if (numel > 0) std::memcpy(node->tensor.data_ptr(), bytes.data(), numel * elem);
  storage_cache_[key] = node->tensor;
  return node;
}

NodePtr TorchPickleBuilder::rebuild_tensor(const std::vector<NodePtr>& a) {
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks, ...)
  if (a.size() < 4 || a[0]->kind != Node::kStorage || a[1]->kind != Node::kInt ||
      a[2]->kind != Node::kTuple || a[3]->kind != Node::kTuple) {
    throw in_.fail("_rebuild_tensor arguments are not (storage, offset, size, stride, ...)");
  }
  std::vector<int64_t> size, stride;
  for (auto& x : a[2]->items) {
    if (x->kind != Node::kInt || x->i < 0)
      throw in_.fail("tensor size is not a tuple of ints >= 0");
    size.push_back(x->i);
  }
  for (auto& x : a[3]->items) {
    if (x->kind != Node::kInt || x->i < 0)
      throw in_.fail("tensor stride is not a tuple of ints >= 0");
    stride.push_back(x->i);
  }
  if (size.size() != stride.size()) throw in_.fail("tensor size and stride differ in length");
  const at::Tensor& storage = a[0]->tensor;
  const int64_t offset = a[1]->i;
  // The last element addressed must lie inside the storage (an empty tensor addresses none).
  // Every product and sum is checked: sizes, strides and offset are untrusted int64s, and a
  // wrapped bound would let the view reach outside its storage.
  auto geometry = [&] {
    return fmt::format("size [{}] stride [{}] at offset {}", fmt::join(size, ", "),
                       fmt::join(stride, ", "), offset);
  };
  if (offset < 0) throw in_.fail(fmt::format("tensor of {}: negative offset", geometry()));
  bool empty = false;
  int64_t last = offset, numel = 1;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 0) empty = true;
    int64_t extent = 0;
    if (__builtin_mul_overflow(numel, size[d], &numel) ||
        (size[d] > 0 && (__builtin_mul_overflow(size[d] - 1, stride[d], &extent) ||
                         __builtin_add_overflow(last, extent, &last)))) {
      throw in_.fail(
          fmt::format("tensor of {}: its element count or extent overflows int64", geometry()));
    }
  }
  if (!empty && last >= storage.numel()) {
    throw in_.fail(fmt::format("tensor of {} exceeds its storage of {} elements", geometry(),
                               storage.numel()));
  }
  auto n = make(Node::kTensor);
  n->tensor =
      empty ? torch::empty(size, storage.options()) : storage.as_strided(size, stride, offset);
  return n;
}

NodePtr TorchPickleBuilder::reduce(const NodePtr& callable, const NodePtr& args) {
  if (callable->kind != Node::kGlobal) throw in_.fail("REDUCE of a non-global callable");
  if (args->kind != Node::kTuple) throw in_.fail("REDUCE arguments are not a tuple");
  const std::string& g = callable->s;
  const auto& a = args->items;
  if (g == "collections.OrderedDict") {
    if (!a.empty()) throw in_.fail("OrderedDict with constructor arguments");
    return make(Node::kDict);
  }
  if (g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_tensor") {
    return rebuild_tensor(a);
  }
  if (g == "torch._utils._rebuild_parameter" || g == "torch._utils._rebuild_parameter_with_state") {
    if (a.empty() || a[0]->kind != Node::kTensor) throw in_.fail("Parameter without a tensor");
    return a[0];
  }
  // LibTorch's own pickler (torch::pickle_save) tags typed containers; Python's torch.load
  // treats these as identity functions on the container.
  if (g == "torch.jit._pickle.restore_type_tag" || g == "torch.jit._pickle.build_intlist" ||
      g == "torch.jit._pickle.build_tensorlist" || g == "torch.jit._pickle.build_doublelist" ||
      g == "torch.jit._pickle.build_boollist") {
    if (a.empty()) throw in_.fail(g + " without an argument");
    return a[0];
  }
  if (g == "torch.device") {
    if (a.empty() || a[0]->kind != Node::kStr) throw in_.fail("torch.device without a name");
    auto s = make(Node::kStr);
    s->s = a[0]->s;
    if (a.size() > 1 && a[1]->kind == Node::kInt) s->s += ":" + std::to_string(a[1]->i);
    return s;
  }
  if (g == "_codecs.encode") {  // protocol 2's spelling of bytes: encode(str, 'latin1')
    if (a.size() != 2 || a[0]->kind != Node::kStr) throw in_.fail("bad _codecs.encode");
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
        throw in_.fail("_codecs.encode of a non-latin-1 string");
      }
    }
    return b;
  }
  throw in_.fail(
      fmt::format("the file needs the Python global {}, which a C++ reader cannot "
                  "construct; save plain containers and tensors (e.g. "
                  "model.state_dict())",
                  g));
}

}  // namespace ddp::torch_pickle
