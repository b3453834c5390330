// Doctor check "blas": which BLAS libblas.so.3 is. LibTorch's CPU matmuls (Linear layers)
// call it; Debian's reference implementation is several times slower than an optimized one.
#include <dlfcn.h>
#include <fmt/format.h>

#include <climits>
#include <cstdlib>

#include "doctor_checks.hpp"

namespace ddp::cluster::detail {

namespace {

// The file that defines `symbol` in `handle`, with symlinks resolved (the alternatives
// system makes libblas.so.3 a link to the chosen implementation).
std::string defining_file(void* handle, const char* symbol) {
  void* address = dlsym(handle, symbol);
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  char resolved[PATH_MAX];
  return realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
}

// "OpenBLAS 0.3.21 ..., OpenMP" or "BLIS 0.9.0"; empty when no known optimized BLAS.
std::string optimized_implementation(void* handle) {
  using Config = const char* (*)();
  using Parallel = int (*)();
  if (auto config = reinterpret_cast<Config>(dlsym(handle, "openblas_get_config"))) {
    std::string text = config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ... MAX_THREADS=64"
    if (auto parallel = reinterpret_cast<Parallel>(dlsym(handle, "openblas_get_parallel"))) {
      // OpenBLAS's codes: 0 single-threaded, 1 its own threads, 2 OpenMP.
      static const char* const kModes[] = {"single-threaded", "pthreads", "OpenMP"};
      const int mode = parallel();
      if (mode >= 0 && mode <= 2) text += fmt::format(", {}", kModes[mode]);
    }
    return text;
  }
  if (auto version = reinterpret_cast<Config>(dlsym(handle, "bli_info_get_version_str"))) {
    return fmt::format("BLIS {}", version());
  }
  if (dlsym(handle, "mkl_get_max_threads") != nullptr) return "Intel MKL";
  if (dlsym(handle, "ATL_buildinfo") != nullptr) return "ATLAS";
  return "";
}

}  // namespace

CheckResult check_blas(const std::string& library) {
  const std::string name = "blas";
  void* handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) {
    return {name, CheckStatus::kSkip,
            fmt::format("{} cannot be loaded ({}); LibTorch needs it for CPU training", library,
                        dlerror())};
  }
  const std::string file = defining_file(handle, "sgemm_");
  const std::string implementation = optimized_implementation(handle);
  dlclose(handle);
  if (file.empty()) {
    return {name, CheckStatus::kWarn,
            fmt::format("{} loads but defines no sgemm_: not a BLAS; LibTorch's CPU matmuls "
                        "will fail to resolve",
                        library)};
  }
  if (!implementation.empty()) {
    return {name, CheckStatus::kOk, fmt::format("{} is {} ({})", library, implementation, file)};
  }
  return {name, CheckStatus::kWarn,
          fmt::format("{} is the reference BLAS ({}): LibTorch's Linear layers run several times "
                      "slower on CPU (the tutorials' CNN: 117 ms per step instead of 40); install "
                      "an optimized one: apt-get install libopenblas0-openmp",
                      library, file)};
}

}  // namespace ddp::cluster::detail
