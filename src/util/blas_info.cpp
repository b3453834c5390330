#include "ddp/util/blas_info.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <climits>
#include <cstdlib>

namespace ddp {

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

BlasInfo inspect_blas(const std::string& library, BlasLookup lookup) {
  BlasInfo info;
  // RTLD_NODELETE: the library stays mapped after dlclose. OpenBLAS's constructor allocates a
  // block that only its own globals point to: once dlclose unmapped them, nothing did, and
  // LeakSanitizer reported 8 bytes leaked whenever `ddprun doctor` ran under ASan.
  const int flags = RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE |
                    (lookup == BlasLookup::kAlreadyLoaded ? RTLD_NOLOAD : 0);
  void* handle = dlopen(library.c_str(), flags);
  if (handle == nullptr) {
    const char* error = dlerror();
    info.load_error = lookup == BlasLookup::kAlreadyLoaded
                          ? "not loaded in this process"
                          : (error != nullptr ? error : "dlopen failed");
    return info;
  }
  info.file = defining_file(handle, "sgemm_");
  info.implementation = optimized_implementation(handle);
  dlclose(handle);
  return info;
}

}  // namespace ddp
