// The MPI backend's flight recorder: collectives (not send/recv) are recorded with their own
// sequence numbers, and a rank whose wait times out writes its record into
// DDP_FLIGHT_RECORDER_DIR (MPI groups have no store, so only that rank writes).

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "../support/throws_with.hpp"
#include "ddp/util/dump_signal.hpp"
#include "ddp/util/error.hpp"
#include "mpi_world.hpp"

namespace ddp::test {
namespace {

using nlohmann::json;

TEST(MpiFlightRecorder, RecordsCollectivesAndDumpsOnTimeout) {
  // A group of its own: its recorder has not dumped yet (a group dumps once).
  ProcessGroupPtr pg = make_mpi_process_group(kTimeout);
  if (pg->size() < 2) GTEST_SKIP() << "needs 2 ranks: run under mpirun -np 2";
  FlightRecorder* recorder = pg->flight_recorder();
  ASSERT_NE(recorder, nullptr);
  pg->set_call_tag("iter=7");
  float x = 1.0f;
  pg->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum)->wait(kTimeout);
  pg->broadcast(&x, 1, DataType::kFloat32, 0)->wait(kTimeout);
  int32_t token = 5;
  if (pg->rank() == 0) pg->send(&token, 1, DataType::kInt32, 1, 3)->wait(kTimeout);
  if (pg->rank() == 1) pg->recv(&token, 1, DataType::kInt32, 0, 3)->wait(kTimeout);
  const json d = json::parse(recorder->dump_json("test"));
  EXPECT_EQ(d["backend"], "mpi");
  ASSERT_EQ(d["entries"].size(), 2u) << d.dump();
  EXPECT_EQ(d["entries"][0]["op"], "all_reduce");
  EXPECT_EQ(d["entries"][0]["seq"], 1);
  EXPECT_EQ(d["entries"][0]["state"], "completed");
  EXPECT_EQ(d["entries"][0]["reduce_op"], "sum");
  EXPECT_EQ(d["entries"][0]["tag"], "iter=7");
  EXPECT_EQ(d["entries"][1]["op"], "broadcast");
  EXPECT_EQ(d["entries"][1]["root"], 0);

  const char* dir = std::getenv("DDP_FLIGHT_RECORDER_DIR");
  if (dir == nullptr) return;  // the ctest registration sets it
  int32_t go = 0;
  if (pg->rank() == 1) {
    pg->recv(&go, 1, DataType::kInt32, 0, 77)->wait(kTimeout);
    pg->barrier()->wait(kTimeout);
    return;
  }
  auto barrier = pg->barrier();
  if (pg->rank() == 0) {
    EXPECT_TRUE(throws_with<TimeoutError>([&] { barrier->wait(std::chrono::milliseconds(50)); },
                                          {"barrier"}));
    std::string group = recorder->identity().group;  // "mpi/<n>/"
    for (char& c : group) c = c == '/' ? '_' : c;
    group.pop_back();
    const std::string path = std::string(dir) + "/flight_recorder." + group + ".rank0.json";
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    ASSERT_TRUE(in.good()) << path;
    const json dump = json::parse(ss.str());
    EXPECT_NE(dump["reason"].get<std::string>().find("did not complete within 50 ms"),
              std::string::npos);
    EXPECT_EQ(dump["entries"].back()["op"], "barrier");
    EXPECT_EQ(dump["entries"].back()["seq"], 3);
    EXPECT_EQ(dump["entries"].back()["state"], "started");
    go = 1;
    pg->send(&go, 1, DataType::kInt32, 1, 77)->wait(kTimeout);
  }
  barrier->wait(kTimeout);
}

// ddprun sends the dump signal to the survivors when a rank dies: an MPI rank, which has no
// store to watch, must write its record from its watcher thread although it is in no
// collective at that moment.
TEST(MpiFlightRecorder, DumpsWhenTheLauncherSendsTheDumpSignal) {
  const char* dir = std::getenv("DDP_FLIGHT_RECORDER_DIR");
  if (dir == nullptr)
    GTEST_SKIP() << "DDP_FLIGHT_RECORDER_DIR unset (the ctest registration sets it)";
  ProcessGroupPtr pg = make_mpi_process_group(kTimeout);
  ASSERT_NE(pg->flight_recorder(), nullptr);
  float x = 1.0f;
  pg->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum)->wait(kTimeout);
  std::string group = pg->flight_recorder()->identity().group;
  for (char& c : group) c = c == '/' ? '_' : c;
  group.pop_back();
  const std::filesystem::path path =
      std::filesystem::path(dir) /
      ("flight_recorder." + group + ".rank" + std::to_string(pg->rank()) + ".json");
  std::filesystem::remove(path);  // a record left by an earlier run of this test

  ASSERT_EQ(std::raise(flight_recorder_dump_signal()), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  ASSERT_TRUE(in.good()) << "no record at " << path << " 5 s after the dump signal";
  const json dump = json::parse(ss.str());
  EXPECT_NE(dump["reason"].get<std::string>().find("requested by the launcher"), std::string::npos)
      << dump["reason"];
  ASSERT_EQ(dump["entries"].size(), 1u) << dump.dump();
  EXPECT_EQ(dump["entries"][0]["op"], "all_reduce");
  EXPECT_EQ(dump["entries"][0]["state"], "completed");
  pg->barrier()->wait(kTimeout);
}

}  // namespace
}  // namespace ddp::test
