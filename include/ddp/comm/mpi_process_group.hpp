#pragma once
// The MPI backend: a ProcessGroup over MPI_COMM_WORLD (torch.distributed's "mpi" backend).
//
// Ranks come from MPI, not from the store or the torchrun environment: start the workers with
// `mpirun -np N program` (or srun with PMIx). The group works on host memory with OpenMPI's
// non-blocking collectives (MPI_Iallreduce, ...); each Work polls MPI_Test until it completes
// or its timeout passes. float16/bfloat16 reductions use user-defined MPI_Ops; kAvg is a sum
// divided by size() after completion.
//
// MPI is initialised on first use with MPI_THREAD_MULTIPLE (and finalised at exit); when the
// application initialised MPI itself with a lower thread level, every MPI call of this backend
// is serialised behind one process-wide lock. Each group owns a duplicate of MPI_COMM_WORLD, so
// several groups (and the application's own MPI traffic) never match each other's messages.
//
// Limits: counts and offsets must fit in an int (MPI's count type); a larger buffer is a
// UsageError telling the caller to split it. MPI cannot cancel a collective, so a Work that
// timed out stays pending: waiting again may still complete it once the missing rank joins.

#include <chrono>

#include "ddp/comm/process_group.hpp"

namespace ddp {

// A process group over all of MPI_COMM_WORLD: rank() and size() are MPI's. Throws UsageError
// when the torchrun environment disagrees with MPI (WORLD_SIZE set to another size: the
// workers were not started by mpirun), and CollectiveError when MPI fails to initialise.
ProcessGroupPtr make_mpi_process_group(std::chrono::milliseconds timeout);

}  // namespace ddp
