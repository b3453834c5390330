// The operations of the ddp backend that move data without reducing it: broadcast, the
// all_gather and gather family, scatter, and all_to_all (one collective when every rank's
// blocks are even, sends and receives otherwise). They take any dtype: one ddp does not know
// travels as bytes.

#include <numeric>

#include <fmt/format.h>

#include "ddp/util/error.hpp"
#include "flat_tensors.hpp"
#include "process_group_ddp.hpp"
#include "tensor_args.hpp"

namespace ddp::python {

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const auto& t = single_tensor(tensors, "broadcast");
  check_root(opts.rootRank, "broadcast");
  if (opts.rootTensor != 0) throw UsageError("broadcast: the ddp backend takes rootTensor 0");
  const OpRoute route = this->route({t});
  auto buf = route.buffer(t);
  const auto e = move_elements(t.scalar_type(), t.numel());
  const int root = static_cast<int>(opts.rootRank);
  auto start = [this, route, buf, e, root] {
    return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
      return g.broadcast(buf.data_ptr(), e.count, e.dtype, root);
    })};
  };
  return make_work(route, c10d::OpType::BROADCAST, start,
                   [t, buf, route] { route.copy_back(t, buf); }, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  const auto& in = single_tensor(inputs, "all_gather");
  if (outputs.size() != 1) {
    throw UsageError(fmt::format("all_gather: expected one output list, got {}", outputs.size()));
  }
  const std::vector<at::Tensor> outs = outputs[0];
  if (static_cast<int>(outs.size()) != group_size()) {
    if (recoverable_ && static_cast<int>(outs.size()) == getSize()) {
      // Sized by torch.distributed's world size, which stays the launch's after a lost node.
      throw UsageError(fmt::format(
          "all_gather: the output list has {} tensors, torch.distributed's world size (the "
          "launch's), but the job lost a node ({}) and runs with {} ranks: size it by "
          "ddp.StepManager.world_size. PyTorch's DistributedDataParallel constructor does "
          "this (it all-gathers the parameter count), so a worker restarted while the job runs "
          "with fewer ranks than it was launched with cannot build its DDP (docs/recovery.md, "
          "\"Python\")",
          outs.size(), recoverable_->loss_description(), group_size()));
    }
    throw UsageError(
        fmt::format("all_gather: the output list has {} tensors but the group has {} ranks",
                    outs.size(), group_size()));
  }
  check_same(outs, in.scalar_type(), std::nullopt, "all_gather", "output");
  if (outs[group_rank()].numel() != in.numel()) {
    throw UsageError(fmt::format(
        "all_gather: output[{}] (this rank's slot) has {} elements but the input has {}",
        group_rank(), outs[group_rank()].numel(), in.numel()));
  }
  bool equal = true;
  int64_t total = 0;
  for (const auto& o : outs) {
    equal = equal && o.numel() == in.numel();
    total += o.numel();
  }
  // Unequal sizes are all_gather_v, which the lane does not run: the host does.
  std::vector<at::Tensor> all = outs;
  all.push_back(in);
  const OpRoute route = this->route(all, /*lane=*/equal);
  auto src = route.buffer(in);
  auto flat = at::empty({total}, route.options(in));
  WorkDDP::Start start;
  if (equal) {
    const auto e = move_elements(in.scalar_type(), in.numel());
    start = [this, route, src, flat, e] {
      return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
        return g.all_gather(src.data_ptr(), flat.data_ptr(), e.count, e.dtype);
      })};
    };
  } else {
    // Unequal sizes (the ranks' outputs say how much each contributes): all_gather_v.
    const auto e = move_elements(in.scalar_type(), 1);
    std::vector<size_t> counts;
    for (const auto& o : outs) counts.push_back(static_cast<size_t>(o.numel()) * e.count);
    start = [this, route, src, flat, counts, e] {
      return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
        return g.all_gather_v(src.data_ptr(), flat.data_ptr(), counts, e.dtype);
      })};
    };
  }
  auto epilogue = [outs, src, flat, route] {
    int64_t offset = 0;
    for (const auto& o : outs) {
      route.copy_back(o, flat.narrow(0, offset, o.numel()));
      offset += o.numel();
    }
  };
  return make_work(route, c10d::OpType::ALLGATHER, start, std::move(epilogue), outs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& /*opts*/) {
  check_dense(input, "all_gather_into_tensor");
  check_same({output}, input.scalar_type(), input.numel() * group_size(), "all_gather_into_tensor",
             "output");
  const OpRoute route = this->route({input, output});
  auto src = route.buffer(input);
  auto dst = route.buffer(output);
  const auto e = move_elements(input.scalar_type(), input.numel());
  auto start = [this, route, src, dst, e] {
    return std::vector<WorkPtr>{run(route, [&](ProcessGroup& g) {
      return g.all_gather(src.data_ptr(), dst.data_ptr(), e.count, e.dtype);
    })};
  };
  at::Tensor out = output;
  return make_work(route, c10d::OpType::_ALLGATHER_BASE, start,
                   [out, src, dst, route] { route.copy_back(out, dst); }, {out});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  const char* op = "all_gather_coalesced";
  if (static_cast<int>(outputs.size()) != group_size()) {
    throw UsageError(fmt::format("{}: expected {} output lists (one per rank), got {}", op,
                                 group_size(), outputs.size()));
  }
  // Every input travels as bytes, packed in order; every rank's outputs match the inputs.
  std::vector<at::Tensor> staged;
  int64_t bytes = 0;
  for (const auto& t : inputs) {
    check_dense(t, op);
    staged.push_back(host_contiguous(t));
    bytes += static_cast<int64_t>(t.nbytes());
  }
  for (const auto& list : outputs) {
    if (list.size() != inputs.size()) {
      throw UsageError(fmt::format("{}: an output list has {} tensors but there are {} inputs", op,
                                   list.size(), inputs.size()));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      check_same({list[i]}, inputs[i].scalar_type(), inputs[i].numel(), op, "output");
    }
  }
  std::vector<at::Tensor> byte_views;
  for (const auto& s : staged) byte_views.push_back(bytes_of(s));
  auto packed = byte_views.empty() ? at::empty({0}, at::kByte) : at::cat(byte_views);
  auto flat = at::empty({bytes * group_size()}, at::kByte);
  auto start = [this, packed, flat, bytes] {
    return std::vector<WorkPtr>{live()->all_gather(packed.data_ptr(), flat.data_ptr(),
                                                   static_cast<size_t>(bytes), DataType::kUInt8)};
  };
  auto outs = outputs;
  auto epilogue = [outs, packed, flat, bytes] {
    for (size_t r = 0; r < outs.size(); ++r) {
      int64_t offset = static_cast<int64_t>(r) * bytes;
      for (const auto& o : outs[r]) {
        auto dst = host_contiguous(o);
        const auto n = static_cast<int64_t>(o.nbytes());
        bytes_of(dst).copy_(flat.narrow(0, offset, n));
        copy_back(o, dst);
        offset += n;
      }
    }
  };
  std::vector<at::Tensor> all;
  for (const auto& l : outs) all.insert(all.end(), l.begin(), l.end());
  return make_work(c10d::OpType::ALLGATHER_COALESCED, start, std::move(epilogue), all);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const auto& in = single_tensor(inputs, "gather");
  check_root(opts.rootRank, "gather");
  const bool root = opts.rootRank == group_rank();
  std::vector<at::Tensor> outs;
  if (root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != group_size()) {
      throw UsageError(fmt::format(
          "gather: the root needs one output list of {} tensors (got {} lists{})", group_size(),
          outputs.size(),
          outputs.empty() ? std::string() : fmt::format(", the first of {}", outputs[0].size())));
    }
    outs = outputs[0];
    check_same(outs, in.scalar_type(), in.numel(), "gather", "gather_list");
  } else if (!outputs.empty() && !outputs[0].empty()) {
    throw UsageError("gather: only the root passes a gather_list");
  }
  auto src = host_contiguous(in);
  auto flat = root ? at::empty({in.numel() * group_size()}, host_options(in)) : at::Tensor();
  const auto e = move_elements(in.scalar_type(), in.numel());
  const int root_rank = static_cast<int>(opts.rootRank);
  auto start = [this, src, flat, e, root_rank] {
    return std::vector<WorkPtr>{live()->gather(
        src.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, e.count, e.dtype, root_rank)};
  };
  auto epilogue = [outs, src, flat] {
    for (size_t r = 0; r < outs.size(); ++r) {
      const auto n = outs[r].numel();
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    }
  };
  return make_work(c10d::OpType::GATHER, start, std::move(epilogue), outs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const auto& out = single_tensor(outputs, "scatter");
  check_root(opts.rootRank, "scatter");
  const bool root = opts.rootRank == group_rank();
  at::Tensor flat;
  if (root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != group_size()) {
      throw UsageError(fmt::format(
          "scatter: the root needs one scatter_list of {} tensors (got {} lists{})", group_size(),
          inputs.size(),
          inputs.empty() ? std::string() : fmt::format(", the first of {}", inputs[0].size())));
    }
    check_same(inputs[0], out.scalar_type(), out.numel(), "scatter", "scatter_list");
    flat = pack(inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    throw UsageError("scatter: only the root passes a scatter_list");
  }
  auto dst = host_contiguous(out);
  const auto e = move_elements(out.scalar_type(), out.numel());
  const int root_rank = static_cast<int>(opts.rootRank);
  auto start = [this, flat, dst, e, root_rank] {
    return std::vector<WorkPtr>{live()->scatter(flat.defined() ? flat.data_ptr() : nullptr,
                                                dst.data_ptr(), e.count, e.dtype, root_rank)};
  };
  return make_work(c10d::OpType::SCATTER, start, [out, dst, flat] { copy_back(out, dst); }, {out});
}

bool ProcessGroupDDP::all_ranks_even(int64_t block_elements) {
  auto bounds = at::tensor({block_elements, -block_elements}, at::kLong);
  auto start = [this, bounds] {
    return std::vector<WorkPtr>{
        live()->all_reduce(bounds.data_ptr(), 2, DataType::kInt64, ReduceOp::kMax)};
  };
  // Ordered like any operation (issue order); not counted as a collective of the caller's.
  // Waits up to the group timeout; a rank that never calls `op` makes this throw, naming it.
  make_work(c10d::OpType::ALLREDUCE, start, nullptr, {}, /*counted=*/false)->wait(timeout_);
  // max == -min: every rank passed the same value; >= 0: none was uneven.
  const auto* b = bounds.data_ptr<int64_t>();
  return b[0] >= 0 && b[0] == -b[1];
}

std::vector<WorkPtr> ProcessGroupDDP::exchange(const std::vector<at::Tensor>& send_blocks,
                                               const std::vector<at::Tensor>& recv_blocks) {
  // Negative tags never collide with the user's (torch.distributed tags are >= 0); every rank
  // numbers its exchanges alike because collectives are called in the same order.
  const int tag = -1 - static_cast<int>(exchange_seq_++ % (1 << 30));
  std::vector<WorkPtr> works;
  ProcessGroup* group = live();  // one generation for the whole exchange
  const int me = group->rank(), size = group->size();
  recv_blocks[me].copy_(send_blocks[me]);
  for (int p = 0; p < size; ++p) {
    if (p == me || recv_blocks[p].numel() == 0) continue;
    works.push_back(group->recv(bytes_of(recv_blocks[p]).data_ptr(), recv_blocks[p].nbytes(),
                                DataType::kUInt8, p, tag));
  }
  for (int p = 0; p < size; ++p) {
    if (p == me || send_blocks[p].numel() == 0) continue;
    works.push_back(
        group->send(send_blocks[p].data_ptr(), send_blocks[p].nbytes(), DataType::kUInt8, p, tag));
  }
  return works;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& /*opts*/) {
  const char* op = "all_to_all_single";
  check_dense(input, op);
  check_same({output}, input.scalar_type(), std::nullopt, op, "output");
  auto splits_ok = [&](const std::vector<int64_t>& s, const at::Tensor& t, const char* what) {
    if (s.empty()) {
      if (t.dim() == 0 || t.size(0) % group_size() != 0) {
        throw UsageError(
            fmt::format("{}: {} of shape {} does not split evenly into {} ranks along dim 0; pass "
                        "{}_split_sizes",
                        op, what, c10::str(t.sizes()), group_size(), what));
      }
      return std::vector<int64_t>(group_size(), t.size(0) / group_size());
    }
    if (static_cast<int>(s.size()) != group_size() ||
        std::accumulate(s.begin(), s.end(), int64_t{0}) != t.size(0)) {
      throw UsageError(fmt::format(
          "{}: {}_split_sizes has {} entries summing to {}; it needs {} entries summing to "
          "{} (dim 0 of the {})",
          op, what, s.size(), std::accumulate(s.begin(), s.end(), int64_t{0}), group_size(),
          t.dim() ? t.size(0) : 0, what));
    }
    return s;
  };
  const auto in_splits = splits_ok(input_splits, input, "input");
  const auto out_splits = splits_ok(output_splits, output, "output");
  auto src = host_contiguous(input);
  auto dst = host_contiguous(output);
  const int64_t in_row = input.size(0) ? input.numel() / input.size(0) : 0;
  const int64_t out_row = output.size(0) ? output.numel() / output.size(0) : 0;
  const bool even_here = std::all_of(in_splits.begin(), in_splits.end(),
                                     [&](int64_t s) { return s == in_splits[0]; }) &&
                         in_splits == out_splits && in_row == out_row;
  WorkDDP::Start start;
  if (all_ranks_even(even_here ? in_splits[0] * in_row : -1)) {
    const auto e = move_elements(input.scalar_type(), in_splits[0] * in_row);
    start = [this, src, dst, e] {
      return std::vector<WorkPtr>{
          live()->all_to_all(src.data_ptr(), dst.data_ptr(), e.count, e.dtype)};
    };
  } else {
    std::vector<at::Tensor> sends, recvs;
    int64_t so = 0, ro = 0;
    for (int p = 0; p < group_size(); ++p) {
      sends.push_back(src.reshape(-1).narrow(0, so * in_row, in_splits[p] * in_row));
      recvs.push_back(dst.reshape(-1).narrow(0, ro * out_row, out_splits[p] * out_row));
      so += in_splits[p];
      ro += out_splits[p];
    }
    if (sends[group_rank()].numel() != recvs[group_rank()].numel()) {
      throw UsageError(
          fmt::format("{}: this rank sends itself {} elements but expects {} from itself", op,
                      sends[group_rank()].numel(), recvs[group_rank()].numel()));
    }
    start = [this, sends, recvs] { return exchange(sends, recvs); };
  }
  at::Tensor out = output;
  return make_work(c10d::OpType::ALLTOALL_BASE, start, [out, src, dst] { copy_back(out, dst); },
                   {out});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& /*opts*/) {
  const char* op = "all_to_all";
  if (static_cast<int>(inputs.size()) != group_size() ||
      static_cast<int>(outputs.size()) != group_size()) {
    throw UsageError(fmt::format("{}: needs {} input and {} output tensors (got {} and {})", op,
                                 group_size(), group_size(), inputs.size(), outputs.size()));
  }
  check_dense(inputs[0], op);
  const auto dtype = inputs[0].scalar_type();
  check_same(inputs, dtype, std::nullopt, op, "input_tensor_list");
  check_same(outputs, dtype, std::nullopt, op, "output_tensor_list");
  const int64_t n = inputs[0].numel();
  bool even = true;
  for (int p = 0; p < group_size(); ++p) {
    even = even && inputs[p].numel() == n && outputs[p].numel() == n;
  }
  std::vector<at::Tensor> outs = outputs;
  if (all_ranks_even(even ? n : -1)) {
    auto src = pack(inputs);
    auto flat = at::empty({n * group_size()}, host_options(inputs[0]));
    const auto e = move_elements(dtype, n);
    auto start = [this, src, flat, e] {
      return std::vector<WorkPtr>{
          live()->all_to_all(src.data_ptr(), flat.data_ptr(), e.count, e.dtype)};
    };
    auto epilogue = [outs, src, flat, n] {
      for (size_t p = 0; p < outs.size(); ++p) {
        outs[p].copy_(flat.narrow(0, static_cast<int64_t>(p) * n, n).view(outs[p].sizes()));
      }
    };
    return make_work(c10d::OpType::ALLTOALL, start, std::move(epilogue), outs);
  }
  std::vector<at::Tensor> sends, recvs;
  for (int p = 0; p < group_size(); ++p) {
    sends.push_back(host_contiguous(inputs[p]));
    recvs.push_back(host_contiguous(outputs[p]));
  }
  if (sends[group_rank()].numel() != recvs[group_rank()].numel()) {
    throw UsageError(fmt::format("{}: this rank sends itself {} elements but expects {}", op,
                                 sends[group_rank()].numel(), recvs[group_rank()].numel()));
  }
  auto start = [this, sends, recvs] { return exchange(sends, recvs); };
  auto epilogue = [outs, sends, recvs] {
    for (size_t p = 0; p < outs.size(); ++p) copy_back(outs[p], recvs[p]);
  };
  return make_work(c10d::OpType::ALLTOALL, start, std::move(epilogue), outs);
}

}  // namespace ddp::python
