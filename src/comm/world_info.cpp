#include "ddp/comm/world_info.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "ddp/util/error.hpp"

namespace ddp {

namespace {

std::optional<int> read_int(const EnvLookup& getenv, const char* name) {
  auto v = getenv(name);
  if (!v || v->empty()) return std::nullopt;
  try {
    size_t used = 0;
    const long x = std::stol(*v, &used);
    if (used != v->size() || x < 0 || x > 1 << 30) throw std::invalid_argument("range");
    return static_cast<int>(x);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("{}={} is not a non-negative integer; fix or unset it", name, *v));
  }
}

struct Source {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

}  // namespace

WorldInfo detect_world_info(const EnvLookup& lookup) {
  EnvLookup getenv = lookup;
  if (!getenv) {
    getenv = [](const char* n) -> std::optional<std::string> {
      const char* v = std::getenv(n);
      if (v == nullptr) return std::nullopt;
      return std::string(v);
    };
  }
  static const Source kSources[] = {
      {"env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
  };
  for (const Source& s : kSources) {
    const auto rank = read_int(getenv, s.rank);
    const auto size = read_int(getenv, s.size);
    if (!rank || !size) continue;
    if (*size < 1 || *rank >= *size) {
      throw UsageError(fmt::format("{}={} is out of range for {}={}; rank must be in [0, {})",
                                   s.rank, *rank, s.size, *size, *size));
    }
    WorldInfo info;
    info.rank = *rank;
    info.world_size = *size;
    info.source = s.name;
    info.local_rank = read_int(getenv, s.local_rank);
    // SLURM_NTASKS_PER_NODE may read "2(x3)" on heterogeneous allocations: keep it only when
    // it is a plain number.
    try {
      info.local_world_size = read_int(getenv, s.local_size);
    } catch (const UsageError&) {
      if (std::string(s.name) != "slurm") throw;
    }
    return info;
  }
  WorldInfo info;
  info.source = "default";
  return info;
}

}  // namespace ddp
