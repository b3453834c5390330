#include "recovery_membership.hpp"

#include <fmt/format.h>
#include <pybind11/chrono.h>

#include <chrono>
#include <memory>
#include <string>

#include "ddp/comm/recoverable_group.hpp"
#include "ddp/util/error.hpp"

namespace py = pybind11;

namespace ddp::python {

namespace {

std::chrono::milliseconds to_ms(std::chrono::duration<double> d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

// Owns the RecoverableGroup so that close() can end it (which records this slot's finish in
// the job's store) at a point the program chooses, not when Python collects the object.
class RecoveryMembership {
 public:
  RecoveryMembership(std::chrono::duration<double> timeout, const std::string& group_name) {
    RecoverableGroupOptions o;
    o.membership_only = true;
    o.timeout = to_ms(timeout);
    o.group_name = group_name;
    group_ = std::make_unique<RecoverableGroup>(o);
  }

  RecoverableGroup& group() const {
    if (!group_) {
      throw UsageError("ddp.StepManager: the membership was closed (the job's last step ended)");
    }
    return *group_;
  }

  void close() { group_.reset(); }

 private:
  std::unique_ptr<RecoverableGroup> group_;
};

}  // namespace

void bind_recovery_membership(py::module& m) {
  py::class_<RecoveryMembership>(m, "_RecoveryMembership")
      .def(py::init<std::chrono::duration<double>, const std::string&>(), py::arg("timeout"),
           py::arg("group_name"), py::call_guard<py::gil_scoped_release>(),
           "Joins the current membership generation of ddprun --recovery step (the store from "
           "MASTER_ADDR/MASTER_PORT, this slot from RANK and WORLD_SIZE); blocks until every "
           "member arrived, at most `timeout`.")
      .def_property_readonly("generation",
                             [](const RecoveryMembership& s) { return s.group().generation(); })
      .def_property_readonly("rank", [](const RecoveryMembership& s) { return s.group().rank(); })
      .def_property_readonly("world_size",
                             [](const RecoveryMembership& s) { return s.group().world_size(); })
      .def("stale", [](const RecoveryMembership& s) { return s.group().stale(); })
      .def(
          "loss",
          [](const RecoveryMembership& s) -> std::string {
            const RecoverableGroup& g = s.group();
            if (!g.stale()) return "";
            return fmt::format("{} (membership generation {} announced by ddprun --recovery step)",
                               g.loss_description(), g.announced_generation());
          },
          "What opened the newest generation, as the ddp backend's PeerLostError says it ('' "
          "while none is newer than the group's).")
      .def(
          "wait_announced_after",
          [](const RecoveryMembership& s, int64_t generation,
             std::chrono::duration<double> timeout) {
            return s.group().wait_announced_after(generation, to_ms(timeout));
          },
          py::arg("generation"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
          "True as soon as a generation newer than `generation` was announced; False after "
          "`timeout`.")
      .def(
          "reform", [](RecoveryMembership& s) { s.group().reform(); },
          py::call_guard<py::gil_scoped_release>(),
          "Joins the newest generation (collective over its members; blocks up to the timeout).")
      .def("close", &RecoveryMembership::close, py::call_guard<py::gil_scoped_release>(),
           "Ends the membership; records in the job's store that this slot finished.");
}

}  // namespace ddp::python
