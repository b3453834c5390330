// Doctor check "blas": which BLAS libblas.so.3 is (ddp/util/blas_info.hpp). It matters to a
// LibTorch linked against the system's libblas.so.3 (Debian's); a PyTorch wheel's LibTorch
// carries MKL and never loads it.
#include <fmt/format.h>

#include "ddp/util/blas_info.hpp"
#include "doctor_checks.hpp"

namespace ddp::cluster::detail {

CheckResult check_blas(const std::string& library) {
  const std::string name = "blas";
  const BlasInfo info = inspect_blas(library);
  if (!info.available()) {
    return {name, CheckStatus::kSkip,
            fmt::format("{} cannot be loaded ({}); only a LibTorch linked against the system "
                        "BLAS (Debian's libtorch) needs it, PyTorch wheels carry their own",
                        library, info.load_error)};
  }
  if (info.file.empty()) {
    return {name, CheckStatus::kWarn,
            fmt::format("{} loads but defines no sgemm_: not a BLAS; LibTorch's CPU matmuls "
                        "will fail to resolve",
                        library)};
  }
  if (!info.implementation.empty()) {
    return {name, CheckStatus::kOk,
            fmt::format("{} is {} ({})", library, info.implementation, info.file)};
  }
  return {
      name, CheckStatus::kWarn,
      fmt::format("{} is the reference BLAS ({}): {}", library, info.file, kReferenceBlasAdvice)};
}

}  // namespace ddp::cluster::detail
