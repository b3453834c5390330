// The mpi backend as a plugin (src/comm/mpi_plugin.hpp), seen from a program that links ddp_comm
// only, as ddprun, ddp's Python extension and most trainers do: the plugin (and with it the MPI
// library) is loaded when the mpi backend is first asked for; on a machine without an MPI
// library only that request fails, with one error that names the missing library and the fix.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "ddp/comm/init.hpp"
#include "ddp/util/error.hpp"

namespace ddp::test {
namespace {

constexpr std::chrono::milliseconds kTimeout{std::chrono::seconds(60)};
constexpr const char* kPluginFile = "libddp_comm_mpi.so";

bool plugin_loaded() {
  void* handle = ::dlopen(kPluginFile, RTLD_NOW | RTLD_NOLOAD);
  if (handle) ::dlclose(handle);
  return handle != nullptr;
}

// Run by mpirun with 2 ranks (comm_mpi.plugin_ranks2).
TEST(MpiPlugin, IsLoadedOnFirstUseOfTheMpiBackendAndItsGroupWorks) {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) GTEST_SKIP() << "needs mpirun (comm_mpi.plugin_ranks2)";
  ASSERT_FALSE(plugin_loaded()) << "the program loaded the mpi plugin before anyone asked for mpi";
  InitOptions options;
  options.backend = "mpi";
  options.timeout = kTimeout;
  auto group = init_process_group(options);
  ASSERT_TRUE(group);
  EXPECT_TRUE(plugin_loaded());
  EXPECT_EQ(group->backend_name(), "mpi");
  int64_t value = group->rank() + 1;
  group->all_reduce(&value, 1, DataType::kInt64, ReduceOp::kSum)->wait(kTimeout);
  const int64_t n = group->size();
  EXPECT_EQ(value, n * (n + 1) / 2);
}

// A copy of the build's plugin whose MPI library is named libmpX.so.40, which no machine has:
// the plugin as it is on a machine without MPI.
std::string plugin_without_its_mpi_library() {
  std::ifstream in(DDP_TEST_MPI_PLUGIN, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string needed = "libmpi.so.40";
  size_t replaced = 0;
  for (size_t at = bytes.find(needed); at != std::string::npos; at = bytes.find(needed, at)) {
    bytes[at + 5] = 'X';  // libmpX.so.40: same length, so the ELF stays intact
    ++replaced;
  }
  if (replaced == 0) return "";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ddp_mpi_plugin_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / kPluginFile).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(MpiPlugin, WithoutAnMpiLibraryOnlyTheMpiBackendFailsAndSaysWhy) {
  const std::string plugin = plugin_without_its_mpi_library();
  ASSERT_FALSE(plugin.empty()) << DDP_TEST_MPI_PLUGIN << " does not name libmpi.so.40";
  // In a child process: the plugin is loaded (or not) once per process.
  EXPECT_EXIT(
      {
        ::setenv("DDP_MPI_PLUGIN", plugin.c_str(), 1);
        InitOptions options;
        options.backend = "gloo";
        options.rank = 0;
        options.world_size = 1;
        options.timeout = kTimeout;
        auto gloo = init_process_group(options);
        float x = 2;
        gloo->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum)->wait(kTimeout);
        if (x != 2) std::_Exit(3);
        options.backend = "mpi";
        try {
          init_process_group(options);
        } catch (const UsageError& e) {
          std::cerr << e.what() << std::endl;
          std::_Exit(plugin_loaded() ? 4 : 0);
        }
        std::_Exit(5);
      },
      ::testing::ExitedWithCode(0),
      "the mpi backend could not be loaded: libmpX\\.so\\.40: cannot open shared object file.*"
      "load your cluster's MPI \\(e\\.g\\. `module load openmpi`\\)");
  std::filesystem::remove_all(std::filesystem::path(plugin).parent_path());
}

}  // namespace
}  // namespace ddp::test
