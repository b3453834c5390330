#pragma once
// Which BLAS a libblas.so.3 is. LibTorch's CPU matmuls (Linear layers) call it, and Debian's
// reference implementation (libblas3, what an install without Recommends gets) is several
// times slower than an optimized one. `ddprun doctor` reports it; DDP warns about it at start.
#include <string>

namespace ddp {

struct BlasInfo {
  std::string load_error;      // why the library is not available; empty when it is
  std::string file;            // the file defining sgemm_, symlinks resolved; empty: none does
  std::string implementation;  // "OpenBLAS 0.3.21 ..., OpenMP", "BLIS 0.9.0", "Intel MKL",
                               // "ATLAS"; empty for the reference BLAS (or an unknown one)

  bool available() const { return load_error.empty(); }
  bool is_reference() const { return available() && !file.empty() && implementation.empty(); }
};

enum class BlasLookup {
  kLoad,           // open the library (the doctor: what a training process would get)
  kAlreadyLoaded,  // only if this process has it loaded already (RTLD_NOLOAD)
};

// Never throws; a library that cannot be opened is reported in load_error.
BlasInfo inspect_blas(const std::string& library, BlasLookup lookup = BlasLookup::kLoad);

// What the reference BLAS costs and how to replace it, for messages about it.
constexpr const char* kReferenceBlasAdvice =
    "LibTorch's Linear layers run several times slower on CPU (the tutorials' CNN: 117 ms per "
    "step instead of 40); install an optimized one: apt-get install libopenblas0-openmp";

}  // namespace ddp
