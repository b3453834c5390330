// ddp._C: the compiled half of the `ddp` Python package. `import ddp` registers the "ddp"
// torch.distributed backend with the creator defined here (python/ddp/__init__.py).

#include <pybind11/chrono.h>
#include <torch/extension.h>

#include "bound_work.hpp"
#include "bucket_order.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/util/error.hpp"
#include "job_store.hpp"
#include "process_group_ddp.hpp"
#include "recovery_membership.hpp"
#include "work_ddp.hpp"

namespace py = pybind11;

namespace {

c10::intrusive_ptr<ddp::python::ProcessGroupBase> create_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<double> timeout, const std::string& group_name) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<ddp::python::ProcessGroupDDP>(store, rank, size, ms, group_name);
}

// The ddp backend behind a torch.distributed Backend object, or a UsageError.
ddp::python::ProcessGroupDDP& ddp_backend(
    const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
  auto* pg = dynamic_cast<ddp::python::ProcessGroupDDP*>(b.get());
  if (pg == nullptr) {
    throw ddp::UsageError("not a process group of the 'ddp' backend (init_process_group(\"ddp\"))");
  }
  return *pg;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ddp's collectives as the 'ddp' torch.distributed backend";
  // Joining blocks until every rank arrived: let other Python threads run meanwhile.
  m.def("_create_process_group", &create_process_group, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::arg("group_name"),
        py::call_guard<py::gil_scoped_release>(),
        "Joins a ddp process group through `store` (what torch.distributed's backend registry "
        "calls).");
  // In-place recovery (python/ddp/recovery.py, docs/recovery.md).
  m.def(
      "_connect_job_store",
      [](std::chrono::duration<double> timeout) {
        return ddp::python::connect_job_store(
            std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
      },
      py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
      "A torch.distributed Store over the store ddprun hosts (MASTER_ADDR:MASTER_PORT).");
  m.def(
      "_publish_lost_rank",
      [](int rank, std::chrono::duration<double> timeout) {
        return ddp::python::publish_lost_rank(
            rank, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
      },
      py::arg("rank"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
      "Announces in the job's store that `rank` was lost, as ddprun does; returns the "
      "membership generation it opened.");
  m.def("_recoverable", [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
    return ddp_backend(b).recoverable();
  });
  m.def("_generation", [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
    return ddp_backend(b).generation();
  });
  m.def("_stale", [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
    return ddp_backend(b).stale();
  });
  m.def("_lost_rank", [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
    return ddp_backend(b).lost_rank();
  });
  m.def("_group_rank", [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
    return ddp_backend(b).group_rank();
  });
  m.def("_group_size", [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
    return ddp_backend(b).group_size();
  });
  m.def("_available_backends", &ddp::available_backends,
        "The backends of ddp's own this build has: cpu, gloo, and mpi, nccl when built.");
  m.def(
      "_cuda_collectives",
      [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
        return ddp_backend(b).cuda_collectives();
      },
      "Where the group runs its CUDA tensors' collectives: 'nccl' (on its NCCL lane, in device "
      "memory), 'host' (staged through host memory), or 'undecided' (a lane exists but no CUDA "
      "operation made its communicator yet).",
      // It may wait while another thread makes the lane's communicator (a store in Python
      // needs the GIL meanwhile).
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_reform",
      [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) { ddp_backend(b).reform(); },
      py::call_guard<py::gil_scoped_release>(),
      "Joins the newest membership generation (collective; blocks up to the group timeout).");
  m.def(
      "_claim_return",
      [](const c10::intrusive_ptr<ddp::python::ProcessGroupBase>& b) {
        ddp_backend(b).claim_return();
      },
      py::call_guard<py::gil_scoped_release>(),
      "--recovery shrink: a replacement claims its slot back and joins the others (collective; "
      "nothing for any other process).");
  ddp::python::bind_recovery_membership(m);
  ddp::python::bind_bucket_order(m);
  // StepManager's waits on PyTorch's backends (python/ddp/torch_generations.py: PendingWaits).
  m.def(
      "_bind_work",
      [](const c10::intrusive_ptr<c10d::Work>& source) -> c10::intrusive_ptr<c10d::Work> {
        return c10::make_intrusive<ddp::python::BoundWork>(source);
      },
      py::arg("source"),
      "A Work whose future completes as `source`'s does, or fails first by _fail_bound_work; "
      "`source`'s completion runs no Python (python/src/bound_work.hpp).");
  m.def(
      "_fail_bound_work",
      [](const c10::intrusive_ptr<c10d::Work>& work, const std::string& message) {
        auto* bound = dynamic_cast<ddp::python::BoundWork*>(work.get());
        if (bound == nullptr) {
          throw ddp::UsageError("_fail_bound_work: not a Work of _bind_work");
        }
        return bound->fail(message);
      },
      py::arg("work"), py::arg("message"),
      "Fails the bound Work's future with `message` (a RuntimeError) unless it completed; "
      "True when this call ended it.");
  m.def(
      "_quiesce_for_exit",
      [](double limit_s) {
        ddp::python::Completer::quiesce_all_for_exit(
            std::chrono::milliseconds(static_cast<int64_t>(limit_s * 1000)));
      },
      py::arg("limit_s"), py::call_guard<py::gil_scoped_release>(),
      "At interpreter exit: lets every group's future callbacks that run finish (at most "
      "limit_s seconds) and starts no other, so none takes the GIL while Python finalizes.");
  m.attr("torch_version_major") = TORCH_VERSION_MAJOR;
}
