// ddp._C: the compiled half of the `ddp` Python package. `import ddp` registers the "ddp"
// torch.distributed backend with the creator defined here (python/ddp/__init__.py).

#include <pybind11/chrono.h>
#include <torch/extension.h>

#include "ddp/comm/types.hpp"
#include "process_group_ddp.hpp"
#include "work_ddp.hpp"

namespace py = pybind11;

namespace {

c10::intrusive_ptr<ddp::python::ProcessGroupBase> create_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<double> timeout, const std::string& group_name) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<ddp::python::ProcessGroupDDP>(store, rank, size, ms, group_name);
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
