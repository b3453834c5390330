#pragma once
// The mpi backend as a plugin: libddp_comm_mpi.so holds everything that calls MPI and is loaded
// when the backend is first asked for, so nothing else of ddp (ddprun, ddp's Python extension,
// a trainer that never uses mpi) needs an MPI library to load. A wheel or machine without MPI
// runs every other backend; asking for mpi there is one UsageError that names what is missing.
// Internal header: the plugin's entry point (mpi/mpi_plugin_entry.cpp) and ddp_comm's loader
// (mpi_plugin_loader.cpp).

#include <chrono>
#include <memory>

#include "ddp/comm/process_group.hpp"
#include "ddp/store/store.hpp"

namespace ddp::mpi_detail {

// What the plugin gives. `build_id` must equal the loader's kMpiPluginBuildId: a plugin of
// another ddp build (another version, compiler or layout of these types) is refused.
struct MpiPluginV1 {
  const char* build_id;
  ProcessGroupPtr (*make_process_group)(std::chrono::milliseconds timeout);
  std::shared_ptr<Store> (*bootstrap_store)(int rank, int world_size,
                                            std::chrono::milliseconds timeout);
};

// The C symbol the plugin exports (extern "C", default visibility).
inline constexpr const char* kMpiPluginSymbol = "ddp_mpi_plugin_v1";
// The plugin's file name, looked for as mpi_plugin() says.
inline constexpr const char* kMpiPluginFile = "libddp_comm_mpi.so";

// The loaded plugin (loaded once per process; a failure is kept and thrown again). Looks in
// this order: the process already holding it (a program linked with ddp::comm_mpi); then
// only the file named by $DDP_MPI_PLUGIN when set; else kMpiPluginFile beside the object that
// holds ddp_comm (ddp's Python extension, a program) and in ../lib from there, the build tree's
// copy, then the dynamic loader's own search (LD_LIBRARY_PATH, the program's RUNPATH). The
// first copy found is the one. Throws UsageError saying why it could not be loaded (most often:
// no libmpi.so.40, i.e. no MPI on the machine) or where it was looked for.
const MpiPluginV1& mpi_plugin();

}  // namespace ddp::mpi_detail
