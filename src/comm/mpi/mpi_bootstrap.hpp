#pragma once
// Bootstrapping a store through MPI, for jobs that mpirun started without MASTER_ADDR and
// MASTER_PORT (Horovod-style launches: `mpirun -np 4 ./trainer`). Rank 0 hosts a TcpStore on
// a free port and broadcasts its address over MPI_COMM_WORLD; every other rank connects to it.
// The cpu and gloo backends then run exactly as under ddprun.

#include <chrono>
#include <memory>

#include "ddp/store/store.hpp"

namespace ddp::mpi_detail {

// Collective over MPI_COMM_WORLD: every rank of the mpirun job must call it (init_process_group
// does). `rank`/`world_size` must be MPI's own (the OpenMPI variables); a mismatch is a
// UsageError. Rank 0 publishes 127.0.0.1 when every rank runs on its node, otherwise the
// address of DDP_GLOO_IFNAME or of the first non-loopback interface that is up (MASTER_ADDR
// wins when set without MASTER_PORT). A failure on rank 0 reaches every rank as an error
// instead of a hang. Logs one line on rank 0 saying how the store was found.
std::shared_ptr<Store> bootstrap_store_over_mpi(int rank, int world_size,
                                                std::chrono::milliseconds timeout);

}  // namespace ddp::mpi_detail
