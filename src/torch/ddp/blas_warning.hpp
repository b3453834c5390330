#pragma once
// DDP's start-up warning about a slow CPU BLAS (ddp/util/blas_info.hpp).

namespace ddp::detail {

// Once per process, and only on local rank 0 (LOCAL_RANK unset or 0): when the libblas.so.3
// this process loaded is the reference BLAS, logs a warning ("ddp.ddp") with the fix.
// Call it for modules with CPU parameters; a GPU step does not use it.
void warn_once_if_reference_blas();

}  // namespace ddp::detail
