#include "ddp/torch/ddp/straggler.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp {

std::optional<StragglerFinding> find_straggler(const std::vector<double>& wait_s,
                                               const std::vector<double>& step_s,
                                               double threshold) {
  const size_t n = wait_s.size();
  if (n < 2 || step_s.size() != n) return std::nullopt;
  const size_t s =
      static_cast<size_t>(std::min_element(wait_s.begin(), wait_s.end()) - wait_s.begin());
  double others = 0, step = 0;
  for (size_t r = 0; r < n; ++r) {
    if (r != s) others += wait_s[r];
    step += step_s[r];
  }
  others /= static_cast<double>(n - 1);
  step /= static_cast<double>(n);
  const double cost = others - wait_s[s];
  if (!(step > 0) || cost <= threshold * step) return std::nullopt;
  StragglerFinding f;
  f.rank = static_cast<int>(s);
  f.cost_s = cost;
  f.step_s = step;
  f.fraction = cost / step;
  return f;
}

std::string describe(const StragglerFinding& f) {
  const double iterations =
      static_cast<double>(std::max<int64_t>(1, f.last_iteration - f.first_iteration + 1));
  return fmt::format(
      "DDP straggler: rank {} made the other ranks wait {:.0f}% of each step over iterations "
      "{}-{} ({:.1f} ms of {:.1f} ms per step on average) in the gradient all-reduces; look at "
      "what rank {} does differently (data loading, a slower or busier node, a larger batch)",
      f.rank, 100.0 * f.fraction, f.first_iteration, f.last_iteration, 1e3 * f.cost_s / iterations,
      1e3 * f.step_s / iterations, f.rank);
}

int64_t StragglerMonitor::window_from_env() {
  const auto v = env::get_int("DDP_STRAGGLER_WINDOW");
  if (!v) return kDefaultWindow;
  if (*v < 0) {
    throw UsageError(fmt::format(
        "DDP_STRAGGLER_WINDOW={}: expected a number of iterations (0 turns the check off)", *v));
  }
  return *v;
}

void StragglerMonitor::log_finding(const ProcessGroup& pg,
                                   const std::optional<StragglerFinding>& finding) const {
  if (finding && pg.rank() == 0) log::get("ddp.ddp")->warn("{}", describe(*finding));
}

}  // namespace ddp
