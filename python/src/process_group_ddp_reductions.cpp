// The reductions of the ddp backend: all_reduce (with the bitwise operators as an all_gather
// plus a local reduction), its coalesced form, reduce and reduce_scatter.

#include <fmt/format.h>

#include "ddp/util/error.hpp"
#include "flat_tensors.hpp"
#include "process_group_ddp.hpp"
#include "tensor_args.hpp"

namespace ddp::python {
namespace {

const char* reduce_op_name(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNKNOWN";
  }
}

bool is_bitwise(const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR ||
         op.op_ == c10d::ReduceOp::BXOR;
}

// ddp's reduction for `op` on `t`, with the dtype it runs on. Throws NotSupportedError for
// operators ddp lacks (bitwise ones are handled by the caller where it can).
std::pair<ddp::ReduceOp, DataType> reduction(const at::Tensor& t, const c10d::ReduceOp& op,
                                             const std::string& what) {
  ddp::ReduceOp r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      r = ddp::ReduceOp::kSum;
      break;
    case c10d::ReduceOp::AVG:
      r = ddp::ReduceOp::kAvg;
      break;
    case c10d::ReduceOp::PRODUCT:
      r = ddp::ReduceOp::kProduct;
      break;
    case c10d::ReduceOp::MIN:
      r = ddp::ReduceOp::kMin;
      break;
    case c10d::ReduceOp::MAX:
      r = ddp::ReduceOp::kMax;
      break;
    default:
      throw NotSupportedError(
          fmt::format("backend ddp does not support ReduceOp.{} in {}{}", reduce_op_name(op), what,
                      op.op_ == c10d::ReduceOp::PREMUL_SUM
                          ? " (PREMUL_SUM is NCCL's; multiply first, then reduce with SUM)"
                      : is_bitwise(op) ? " (bitwise operators are supported by all_reduce only)"
                                       : ""));
  }
  // A bool is 0 or 1 in one byte: min and max over uint8 are logical and / or.
  if (t.scalar_type() == at::kBool && (r == ddp::ReduceOp::kMin || r == ddp::ReduceOp::kMax)) {
    return {r, DataType::kUInt8};
  }
  return {r, reduce_data_type(t.scalar_type(), what)};
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::all_reduce_tensor(const at::Tensor& t,
                                                                  const c10d::ReduceOp& op) {
  if (is_bitwise(op)) return bitwise_all_reduce(t, op);
  const auto [r, dtype] = reduction(t, op, "all_reduce");
  const OpRoute route = this->route({t});
  auto buf = route.buffer(t);
  auto start = [this, route, buf, dtype = dtype, r = r] {
    return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
      return g.all_reduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), dtype, r);
    })};
  };
  return make_work(route, c10d::OpType::ALLREDUCE, start,
                   [t, buf, route] { route.copy_back(t, buf); }, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::bitwise_all_reduce(const at::Tensor& t,
                                                                   const c10d::ReduceOp& op) {
  if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
    throw NotSupportedError(fmt::format(
        "backend ddp does not support ReduceOp.{} on {} tensors (bitwise operators take "
        "integer or bool tensors)",
        reduce_op_name(op), dtype_name(t.scalar_type())));
  }
  auto buf = host_contiguous(t);
  auto gathered = at::empty({group_size(), t.numel()}, host_options(t));
  const auto e = move_elements(t.scalar_type(), t.numel());
  auto start = [this, buf, gathered, e] {
    return std::vector<WorkPtr>{
        live()->all_gather(buf.data_ptr(), gathered.data_ptr(), e.count, e.dtype)};
  };
  const auto kind = op.op_;
  auto epilogue = [t, buf, gathered, kind] {
    at::Tensor acc = gathered[0].clone();
    for (int64_t r = 1; r < gathered.size(0); ++r) {
      if (kind == c10d::ReduceOp::BAND) {
        acc.bitwise_and_(gathered[r]);
      } else if (kind == c10d::ReduceOp::BOR) {
        acc.bitwise_or_(gathered[r]);
      } else {
        acc.bitwise_xor_(gathered[r]);
      }
    }
    t.copy_(acc.view(t.sizes()));
  };
  return make_work(c10d::OpType::ALLREDUCE, start, std::move(epilogue), {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  return all_reduce_tensor(single_tensor(tensors, "all_reduce"), opts.reduceOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) throw UsageError("all_reduce_coalesced: got no tensors");
  check_same(tensors, tensors[0].scalar_type(), std::nullopt, "all_reduce_coalesced", "tensors");
  if (is_bitwise(opts.reduceOp)) {
    throw NotSupportedError(
        fmt::format("backend ddp does not support ReduceOp.{} in "
                    "all_reduce_coalesced",
                    reduce_op_name(opts.reduceOp)));
  }
  const auto [r, dtype] = reduction(tensors[0], opts.reduceOp, "all_reduce_coalesced");
  const OpRoute route = this->route(tensors);
  auto flat = route.pack(tensors);
  auto start = [this, route, flat, dtype = dtype, r = r] {
    return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
      return g.all_reduce(flat.data_ptr(), static_cast<size_t>(flat.numel()), dtype, r);
    })};
  };
  std::vector<at::Tensor> ts = tensors;
  auto epilogue = [ts, flat, route] {
    int64_t offset = 0;
    for (const auto& t : ts) {
      route.copy_back(t, flat.narrow(0, offset, t.numel()));
      offset += t.numel();
    }
  };
  return make_work(route, c10d::OpType::ALLREDUCE_COALESCED, start, std::move(epilogue), ts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const auto& t = single_tensor(tensors, "reduce");
  check_root(opts.rootRank, "reduce");
  if (opts.rootTensor != 0) throw UsageError("reduce: the ddp backend takes rootTensor 0");
  const auto [r, dtype] = reduction(t, opts.reduceOp, "reduce");
  const OpRoute route = this->route({t});
  auto buf = route.buffer(t);
  const int root_rank = static_cast<int>(opts.rootRank);
  auto start = [this, route, buf, dtype = dtype, r = r, root_rank] {
    return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
      return g.reduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), dtype, r, root_rank);
    })};
  };
  // Only the root's result is defined; other ranks' tensors hold unspecified values afterwards
  // (gloo leaves partial sums there too), so only the root copies a staged result back.
  const bool root = opts.rootRank == group_rank();
  auto epilogue = [t, buf, root, route] {
    if (root) route.copy_back(t, buf);
  };
  return make_work(route, c10d::OpType::REDUCE, start, std::move(epilogue), {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const auto& out = single_tensor(outputs, "reduce_scatter");
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != group_size()) {
    throw UsageError(
        fmt::format("reduce_scatter: expected one input list of {} tensors", group_size()));
  }
  check_same(inputs[0], out.scalar_type(), out.numel(), "reduce_scatter", "input_list");
  const auto [r, dtype] = reduction(out, opts.reduceOp, "reduce_scatter");
  std::vector<at::Tensor> all = inputs[0];
  all.push_back(out);
  const OpRoute route = this->route(all);
  auto flat = route.pack(inputs[0]);
  auto dst = route.buffer(out);
  auto start = [this, route, flat, dst, dtype = dtype, r = r] {
    return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
      return g.reduce_scatter(flat.data_ptr(), dst.data_ptr(), static_cast<size_t>(dst.numel()),
                              dtype, r);
    })};
  };
  return make_work(route, c10d::OpType::REDUCE_SCATTER, start,
                   [out, dst, flat, route] { route.copy_back(out, dst); }, {out});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_dense(output, "reduce_scatter_tensor");
  check_same({input}, output.scalar_type(), output.numel() * group_size(), "reduce_scatter_tensor",
             "input");
  const auto [r, dtype] = reduction(output, opts.reduceOp, "reduce_scatter_tensor");
  const OpRoute route = this->route({input, output});
  auto src = route.buffer(input);
  auto dst = route.buffer(output);
  auto start = [this, route, src, dst, dtype = dtype, r = r] {
    return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
      return g.reduce_scatter(src.data_ptr(), dst.data_ptr(), static_cast<size_t>(dst.numel()),
                              dtype, r);
    })};
  };
  at::Tensor out = output;
  return make_work(route, c10d::OpType::_REDUCE_SCATTER_BASE, start,
                   [out, dst, src, route] { route.copy_back(out, dst); }, {out});
}

}  // namespace ddp::python
