// ddp._C: the compiled half of the `ddp` Python package. `import ddp` registers the "ddp"
// torch.distributed backend with the creator defined here (python/ddp/__init__.py).

#include <pybind11/chrono.h>
#include <torch/extension.h>

#include "ddp/comm/types.hpp"
#include "process_group_ddp.hpp"

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
  m.attr("torch_version_major") = TORCH_VERSION_MAJOR;
}
