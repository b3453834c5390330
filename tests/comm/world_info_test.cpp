// World detection: precedence of torchrun env, SLURM, OpenMPI; malformed values.

#include "ddp/comm/world_info.hpp"

#include <gtest/gtest.h>

#include <map>

#include "ddp/util/error.hpp"

namespace ddp {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(WorldInfo, NothingSetIsASingleProcess) {
  const WorldInfo w = detect_world_info(env_of({}));
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_EQ(w.source, "default");
}

TEST(WorldInfo, TorchrunContractWinsOverSlurmAndOpenMpi) {
  const WorldInfo w = detect_world_info(env_of({{"RANK", "3"},
                                                {"WORLD_SIZE", "8"},
                                                {"LOCAL_RANK", "1"},
                                                {"LOCAL_WORLD_SIZE", "2"},
                                                {"SLURM_PROCID", "0"},
                                                {"SLURM_NTASKS", "1"},
                                                {"OMPI_COMM_WORLD_RANK", "5"},
                                                {"OMPI_COMM_WORLD_SIZE", "6"}}));
  EXPECT_EQ(w.source, "env");
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
}

TEST(WorldInfo, SlurmThenOpenMpi) {
  WorldInfo w = detect_world_info(env_of({{"SLURM_PROCID", "4"},
                                          {"SLURM_NTASKS", "6"},
                                          {"SLURM_LOCALID", "0"},
                                          {"SLURM_NTASKS_PER_NODE", "2(x3)"},
                                          {"OMPI_COMM_WORLD_RANK", "1"},
                                          {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_EQ(w.source, "slurm");
  EXPECT_EQ(w.rank, 4);
  EXPECT_EQ(w.world_size, 6);
  EXPECT_EQ(w.local_rank, 0);
  EXPECT_FALSE(w.local_world_size.has_value());  // "2(x3)" is not a plain count

  w = detect_world_info(env_of({{"RANK", "1"},  // incomplete: no WORLD_SIZE
                                {"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  EXPECT_EQ(w.source, "openmpi");
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.world_size, 2);
  EXPECT_EQ(w.local_rank, 1);
}

TEST(WorldInfo, MalformedOrInconsistentValuesNameTheVariable) {
  try {
    detect_world_info(env_of({{"RANK", "one"}, {"WORLD_SIZE", "2"}}));
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=one is not a non-negative integer"),
              std::string::npos)
        << e.what();
  }
  try {
    detect_world_info(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}));
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=2 is out of range for WORLD_SIZE=2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp
