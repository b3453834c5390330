#pragma once
// The process-wide side of MPI: initialisation, thread level, finalisation at exit, and the
// datatypes and reduction operators the backend uses. MPI itself is per process, so this is
// the one legitimate process-wide object of the backend; per-group state (the communicator,
// sequence numbers) lives in the process group.

#include <mpi.h>

#include <mutex>
#include <string>

#include "ddp/comm/types.hpp"

namespace ddp::mpi_detail {

class Runtime {
 public:
  // The runtime, initialising MPI on first use (MPI_Init_thread asking MPI_THREAD_MULTIPLE)
  // unless the application already did. Throws CollectiveError when MPI fails to start.
  static Runtime& get();

  // Guards one MPI call (or a short sequence). Holds a process-wide mutex only when MPI does
  // not provide MPI_THREAD_MULTIPLE; otherwise the returned lock owns nothing.
  std::unique_lock<std::mutex> lock();

  // The MPI thread level in effect (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const { return thread_level_; }
  bool serialised() const { return serialised_; }

  // The MPI datatype carrying dtype. float16 and bfloat16 travel as MPI_UINT16_T and are only
  // ever reduced with the user-defined operators of op(). Throws UsageError on a bad dtype.
  MPI_Datatype datatype(DataType dtype) const;

  // The MPI operator computing op on dtype. kAvg maps to the sum (the caller divides after
  // completion). Throws UsageError on a bad op or dtype.
  MPI_Op op(DataType dtype, ReduceOp op) const;

 private:
  Runtime();

  int thread_level_ = MPI_THREAD_SINGLE;
  bool serialised_ = true;
  std::mutex mutex_;
  // User-defined operators for the 16-bit float types, indexed [is_bfloat16][ReduceOp].
  MPI_Op half_ops_[2][5] = {};
};

// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
std::string error_string(int code);

}  // namespace ddp::mpi_detail
