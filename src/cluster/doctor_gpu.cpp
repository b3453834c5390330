// Doctor checks on GPUs: the NVIDIA driver's GPU list against CUDA_VISIBLE_DEVICES, and
// whether the NCCL library can be loaded.
#include <dirent.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "doctor_checks.hpp"

namespace ddp::cluster::detail {

namespace {

struct Gpu {
  std::string bus_id;  // the directory name, e.g. 0000:3b:00.0
  std::string model;
  std::string uuid;  // "GPU-..."
};

std::string field(const std::string& information, const std::string& key) {
  size_t at = information.find(key + ":");
  if (at == std::string::npos) return "";
  size_t begin = information.find_first_not_of(" \t", at + key.size() + 1);
  size_t end = information.find('\n', at);
  if (begin == std::string::npos || begin >= end) return "";
  return information.substr(begin, end - begin);
}

// The GPUs the driver lists, ordered by PCI bus id. Empty when the directory is absent.
std::vector<Gpu> list_gpus(const std::string& dir) {
  std::vector<Gpu> gpus;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return gpus;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::ifstream in(dir + "/" + name + "/information");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    gpus.push_back({name, field(text, "Model"), field(text, "GPU UUID")});
  }
  closedir(d);
  std::sort(gpus.begin(), gpus.end(),
            [](const Gpu& a, const Gpu& b) { return a.bus_id < b.bus_id; });
  return gpus;
}

std::string summary(const std::vector<Gpu>& gpus) {
  std::map<std::string, int> models;
  for (const auto& g : gpus) ++models[g.model.empty() ? "unknown model" : g.model];
  std::vector<std::string> parts;
  for (const auto& [model, n] : models) parts.push_back(fmt::format("{} x {}", n, model));
  return fmt::format("{}", fmt::join(parts, ", "));
}

CheckResult check_visible_devices(const EnvMap& env, const std::vector<Gpu>& gpus,
                                  const std::string& dir) {
  const std::string name = "gpus";
  auto cvd_it = env.find("CUDA_VISIBLE_DEVICES");
  if (cvd_it == env.end()) {
    if (gpus.empty()) {
      return {name, CheckStatus::kOk,
              fmt::format("no NVIDIA GPU ({} absent or empty): train on CPU with the gloo/cpu "
                          "backend",
                          dir)};
    }
    return {name, CheckStatus::kOk,
            fmt::format("{} GPU{} visible: {}", gpus.size(), gpus.size() == 1 ? "" : "s",
                        summary(gpus))};
  }
  const std::string& cvd = cvd_it->second;
  if (cvd.empty() || cvd == "-1" || cvd == "none" || cvd == "NoDevFiles") {
    return {name, gpus.empty() ? CheckStatus::kOk : CheckStatus::kWarn,
            fmt::format("CUDA_VISIBLE_DEVICES='{}' hides every GPU{}", cvd,
                        gpus.empty() ? ""
                                     : fmt::format(" of the {} this node has; unset it to use them",
                                                   gpus.size()))};
  }
  if (gpus.empty()) {
    return {name, CheckStatus::kWarn,
            fmt::format("CUDA_VISIBLE_DEVICES={} but no NVIDIA GPU is listed in {}: the driver "
                        "is not loaded on this node, or this is not a GPU node",
                        cvd, dir)};
  }
  // CUDA stops at the first entry it cannot use, silently hiding the rest: every entry must
  // be a valid index or (a prefix of) a GPU's UUID, and none may repeat.
  std::vector<std::string> entries;
  size_t begin = 0;
  while (begin <= cvd.size()) {
    size_t end = cvd.find(',', begin);
    if (end == std::string::npos) end = cvd.size();
    entries.push_back(cvd.substr(begin, end - begin));
    begin = end + 1;
  }
  std::vector<std::string> seen;
  for (const auto& entry : entries) {
    bool ok = false;
    if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string::npos) {
      ok = entry.size() < 6 && static_cast<size_t>(std::stoi(entry)) < gpus.size();
    } else if (entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0) {
      // MIG instances are not listed by the driver here; only GPU UUIDs can be verified.
      ok = entry.rfind("MIG-", 0) == 0 || std::any_of(gpus.begin(), gpus.end(), [&](const Gpu& g) {
             return g.uuid.rfind(entry, 0) == 0;
           });
    }
    if (!ok) {
      return {name, CheckStatus::kFail,
              fmt::format("CUDA_VISIBLE_DEVICES={}: '{}' is not one of this node's {} GPUs "
                          "(indices 0-{}{}); CUDA ignores it and every entry after it",
                          cvd, entry, gpus.size(), gpus.size() - 1,
                          gpus.front().uuid.empty() ? "" : ", or UUIDs GPU-...")};
    }
    if (std::find(seen.begin(), seen.end(), entry) != seen.end()) {
      return {name, CheckStatus::kFail,
              fmt::format("CUDA_VISIBLE_DEVICES={} lists '{}' twice; CUDA rejects duplicates", cvd,
                          entry)};
    }
    seen.push_back(entry);
  }
  return {name, CheckStatus::kOk,
          fmt::format("CUDA_VISIBLE_DEVICES={}: {} of {} GPUs visible ({})", cvd, entries.size(),
                      gpus.size(), summary(gpus))};
}

CheckResult check_nccl(const std::string& library, bool have_gpus) {
  const std::string name = "nccl";
  void* handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) {
    if (!have_gpus) {
      return {name, CheckStatus::kOk,
              fmt::format("{} not found; not needed without GPUs", library)};
    }
    return {name, CheckStatus::kWarn,
            fmt::format("{} cannot be loaded ({}): the nccl backend is unavailable; install "
                        "NCCL (libnccl2) or add its directory to LD_LIBRARY_PATH",
                        library, dlerror())};
  }
  std::string version = "version unknown";
  using GetVersion = int (*)(int*);
  if (auto fn = reinterpret_cast<GetVersion>(dlsym(handle, "ncclGetVersion"))) {
    int code = 0;
    // NCCL >= 2.9 encodes x.y.z as x*10000 + y*100 + z; older ones as x*1000 + y*100 + z.
    if (fn(&code) == 0 && code > 0) {
      version = code >= 10000 ? fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
                              : fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
    }
  }
  dlclose(handle);
  return {name, CheckStatus::kOk, fmt::format("{} loads (NCCL {})", library, version)};
}

}  // namespace

std::vector<CheckResult> check_gpus(const EnvMap& env, const std::string& nvidia_dir,
                                    const std::string& nccl_library) {
  std::vector<Gpu> gpus = list_gpus(nvidia_dir);
  return {check_visible_devices(env, gpus, nvidia_dir), check_nccl(nccl_library, !gpus.empty())};
}

}  // namespace ddp::cluster::detail
