#include "blas_warning.hpp"

#include <cstdlib>
#include <mutex>
#include <string>

#include "ddp/util/blas_info.hpp"
#include "ddp/util/logging.hpp"

namespace ddp::detail {

void warn_once_if_reference_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* local_rank = std::getenv("LOCAL_RANK");
    if (local_rank != nullptr && std::string(local_rank) != "0") return;
    // The library LibTorch linked, as loaded here; a LibTorch with MKL built in has none.
    const BlasInfo info = inspect_blas("libblas.so.3", BlasLookup::kAlreadyLoaded);
    if (!info.is_reference()) return;
    log::get("ddp.ddp")->warn("libblas.so.3 is the reference BLAS ({}): {}", info.file,
                              kReferenceBlasAdvice);
  });
}

}  // namespace ddp::detail
