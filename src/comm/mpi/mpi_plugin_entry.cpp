// The entry point of libddp_comm_mpi.so (src/comm/mpi_plugin.hpp): what ddp_comm's loader
// finds by name after dlopen.
#include "../mpi_plugin.hpp"
#include "ddp/comm/mpi_process_group.hpp"
#include "mpi_bootstrap.hpp"

extern "C" __attribute__((visibility("default"))) const ddp::mpi_detail::MpiPluginV1*
ddp_mpi_plugin_v1() {
  static const ddp::mpi_detail::MpiPluginV1 plugin{
      DDP_MPI_PLUGIN_BUILD_ID,
      &ddp::make_mpi_process_group,
      &ddp::mpi_detail::bootstrap_store_over_mpi,
  };
  return &plugin;
}
