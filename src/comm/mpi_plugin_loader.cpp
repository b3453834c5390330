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
  std::vector<std::string> tried;
  for (const std::string& path : candidates) {
    const bool by_name = path.find('/') == std::string::npos;
    std::error_code ec;
    if (!by_name && !std::filesystem::exists(path, ec)) {
      tried.push_back(path + ": no such file");
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = ::dlerror();
      // Found but unloadable (its MPI library is missing) says more than "not found".
      if (!by_name || (why && std::string(why).find(kMpiPluginFile) == std::string::npos)) {
        tried.push_back(why ? why : path + ": cannot be loaded");
      } else {
        tried.push_back(fmt::format("{} is not on the loader's path", kMpiPluginFile));
      }
      continue;
    }
    const std::string refused = take_mpi_plugin(handle, path, out);
    if (refused.empty()) return out;  // stays loaded for the process
    tried.push_back(refused);
    ::dlclose(handle);
  }
  out.error = fmt::format(
      "the mpi backend could not be loaded: {}. It needs an MPI library (Open MPI 4 or 5: "
      "libmpi.so.40): load your cluster's MPI (e.g. `module load openmpi`) or install Open MPI "
      "(apt install openmpi-bin), or use backend \"gloo\" or \"cpu\"; DDP_MPI_PLUGIN names the "
      "plugin's file when it lies elsewhere",
      fmt::join(tried, "; "));
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
