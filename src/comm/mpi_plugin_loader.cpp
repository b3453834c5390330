#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "mpi_plugin.hpp"

namespace ddp::mpi_detail {

namespace {

using MpiPluginEntryPoint = const MpiPluginV1* (*)();

struct LoadedMpiPlugin {
  const MpiPluginV1* plugin = nullptr;
  std::string error;  // why it could not be loaded (plugin == nullptr)
};

// Where the object holding this code lies (ddp's Python extension, a program linked with
// ddp_comm).
std::filesystem::path mpi_plugin_search_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&mpi_plugin_search_dir), &info) == 0 || !info.dli_fname) {
    return {};
  }
  std::error_code ec;
  const auto path = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::filesystem::path{} : path.parent_path();
}

// The plugin's entry point in `handle`, checked against this build; "" or why not.
std::string take_mpi_plugin(void* handle, const std::string& where, LoadedMpiPlugin& out) {
  auto entry = reinterpret_cast<MpiPluginEntryPoint>(::dlsym(handle, kMpiPluginSymbol));
  if (!entry) return fmt::format("{}: no {} in it", where, kMpiPluginSymbol);
  const MpiPluginV1* plugin = entry();
  if (!plugin || std::string(plugin->build_id) != DDP_MPI_PLUGIN_BUILD_ID) {
    return fmt::format("{}: built by another ddp build ({}, this one is {})", where,
                       plugin ? plugin->build_id : "?", DDP_MPI_PLUGIN_BUILD_ID);
  }
  out.plugin = plugin;
  return "";
}

LoadedMpiPlugin load_mpi_plugin() {
  LoadedMpiPlugin out;
  // Linked in already (ddp::comm_mpi): no file to look for.
  if (void* self = ::dlopen(nullptr, RTLD_NOW)) {
    if (::dlsym(self, kMpiPluginSymbol) && take_mpi_plugin(self, "this program", out).empty())
      return out;
  }
  std::vector<std::string> candidates;
  if (auto named = env::get("DDP_MPI_PLUGIN"); named && !named->empty()) {
    candidates.push_back(*named);  // the user's choice: nothing else is tried
  } else if (const auto dir = mpi_plugin_search_dir(); !dir.empty()) {
    candidates.push_back((dir / kMpiPluginFile).string());
    candidates.push_back((dir / ".." / "lib" / kMpiPluginFile).string());
  }
  if (candidates.size() != 1) {
#ifdef DDP_MPI_PLUGIN_BUILD_PATH
    candidates.push_back(DDP_MPI_PLUGIN_BUILD_PATH);
#endif
    candidates.push_back(kMpiPluginFile);  // the dynamic loader's search
  }
  // The first copy found is the one: when it cannot be loaded (its MPI library is missing),
  // another copy of the same plugin would not be either.
  std::vector<std::string> looked_in;
  std::string failed;
  for (const std::string& path : candidates) {
    const bool by_name = path.find('/') == std::string::npos;
    std::error_code ec;
    if (!by_name && !std::filesystem::exists(path, ec)) {
      looked_in.push_back(path);
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = ::dlerror();
      const std::string reason = why ? why : path + ": cannot be loaded";
      if (by_name && reason.find(kMpiPluginFile) != std::string::npos) {
        looked_in.push_back("the dynamic loader's path");  // not found there either
        continue;
      }
      failed = reason;
      break;
    }
    failed = take_mpi_plugin(handle, path, out);
    if (failed.empty()) return out;  // stays loaded for the process
    ::dlclose(handle);
    break;
  }
  if (failed.empty()) {
    failed =
        fmt::format("{} was not found (looked in: {})", kMpiPluginFile, fmt::join(looked_in, ", "));
  }
  out.error = fmt::format(
      "the mpi backend could not be loaded: {}. It needs an MPI library (Open MPI 4 or 5: "
      "libmpi.so.40): load your cluster's MPI (e.g. `module load openmpi`) or install Open MPI "
      "(apt install openmpi-bin), or use backend \"gloo\" or \"cpu\"; DDP_MPI_PLUGIN names the "
      "plugin's file when it lies elsewhere",
      failed);
  return out;
}

}  // namespace

const MpiPluginV1& mpi_plugin() {
  static std::once_flag once;
  static LoadedMpiPlugin loaded;
  std::call_once(once, [] { loaded = load_mpi_plugin(); });
  if (!loaded.plugin) throw UsageError(loaded.error);
  return *loaded.plugin;
}

}  // namespace ddp::mpi_detail
