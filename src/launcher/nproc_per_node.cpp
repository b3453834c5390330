// How many workers --nproc-per-node asks for: a number, or auto, cpu or gpu counted on this
// node (the GPUs that CUDA_VISIBLE_DEVICES leaves visible, as torch.cuda counts them).
#include "ddp/launcher/cli.hpp"

#include <dirent.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "cli_values.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {

using detail::parse_int;

namespace {

int count_gpus(const std::string& dev_dir) {
  int count = 0;
  DIR* dev = ::opendir(dev_dir.c_str());
  if (dev == nullptr) return 0;
  while (dirent* e = ::readdir(dev)) {
    std::string name = e->d_name;
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        std::all_of(name.begin() + 6, name.end(), [](char c) { return std::isdigit(c); })) {
      ++count;
    }
  }
  ::closedir(dev);
  return count;
}

int count_cpus() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace

int visible_gpu_count(int device_nodes, const std::optional<std::string>& cuda_visible_devices) {
  if (!cuda_visible_devices) return device_nodes;
  // torch.cuda's _parse_visible_devices: comma-separated entries, each stripped.
  std::vector<std::string> entries;
  const std::string& var = *cuda_visible_devices;
  for (size_t start = 0;;) {
    const size_t comma = var.find(',', start);
    std::string e =
        var.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto first = e.find_first_not_of(" \t"), last = e.find_last_not_of(" \t");
    entries.push_back(first == std::string::npos ? "" : e.substr(first, last - first + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  // UUIDs (GPU-...) or MIG names (MIG-...): entries up to the first without the prefix; a
  // repeated entry hides every device.
  for (const std::string prefix : {"GPU-", "MIG-"}) {
    if (var.rfind(prefix, 0) != 0) continue;
    std::vector<std::string> seen;
    for (const auto& e : entries) {
      if (std::find(seen.begin(), seen.end(), e) != seen.end()) return 0;
      if (e.rfind(prefix, 0) != 0) break;
      seen.push_back(e);
    }
    return std::min(static_cast<int>(seen.size()), device_nodes);
  }
  // Ordinals, each read like strtoul (leading digits, "1gpu" is 1): a negative or unreadable
  // entry ends the list, a repeated one hides every device, and the count stops at the first
  // ordinal the machine does not have.
  std::vector<long> seen;
  for (const auto& e : entries) {
    size_t digits = 0;
    const size_t sign = !e.empty() && (e[0] == '+' || e[0] == '-') ? 1 : 0;
    while (sign + digits < e.size() && std::isdigit(static_cast<unsigned char>(e[sign + digits]))) {
      ++digits;
    }
    if (digits == 0 || e[0] == '-') break;
    const long ordinal =
        std::strtol(e.substr(sign, std::min<size_t>(digits, 9)).c_str(), nullptr, 10);
    if (std::find(seen.begin(), seen.end(), ordinal) != seen.end()) return 0;
    seen.push_back(ordinal);
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] >= device_nodes) return static_cast<int>(i);
  }
  return static_cast<int>(seen.size());
}

int resolve_nproc_per_node(const std::string& value, const std::string& flag, const EnvLookup& env,
                           const std::string& dev_dir) {
  if (value == "cpu") return count_cpus();
  if (value == "gpu" || value == "auto") {
    const int nodes = count_gpus(dev_dir);
    const std::optional<std::string> cvd = env("CUDA_VISIBLE_DEVICES");
    const int gpus = visible_gpu_count(nodes, cvd);
    if (gpus > 0) return gpus;
    if (value == "auto") return count_cpus();
    if (nodes > 0 && cvd) {
      throw UsageError(fmt::format(
          "{} gpu: CUDA_VISIBLE_DEVICES='{}' hides every GPU of this node's {} (empty, -1, an "
          "invalid first entry, a repeated entry or ordinals it lacks); list the GPUs to use "
          "(e.g. CUDA_VISIBLE_DEVICES=0,1), or pass a number, cpu or auto",
          flag, *cvd, nodes));
    }
    if (cvd && (cvd->empty() || *cvd == "-1")) {
      throw UsageError(
          fmt::format("{} gpu: CUDA_VISIBLE_DEVICES='{}' hides every GPU; list the GPUs to use "
                      "(e.g. CUDA_VISIBLE_DEVICES=0,1), or pass a number, cpu or auto",
                      flag, *cvd));
    }
    throw UsageError(fmt::format(
        "{} gpu: no NVIDIA GPU found (no {}/nvidia<N>); use a number, cpu or auto", flag, dev_dir));
  }
  return parse_int({value, flag}, 1, 1 << 16,
                   "a worker count: a positive integer, auto, cpu or gpu");
}

}  // namespace ddp::launcher
