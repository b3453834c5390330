// FlightRecorder: the ring (states, wrap-around, tags, off), its dump, the environment knobs,
// and a group of ranks as threads where one rank's collective times out: the failing rank and
// the idle rank (through the store key its watcher polls) both write their record.

#include "ddp/comm/flight_recorder.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/util/error.hpp"

using namespace ddp;
using nlohmann::json;

namespace {

FlightRecorderIdentity identity(int rank = 0, int size = 2) {
  FlightRecorderIdentity id;
  id.group = "default_pg/0/";
  id.backend = "cpu";
  id.rank = rank;
  id.group_size = size;
  for (int r = 0; r < size; ++r) id.global_ranks.push_back(r);
  return id;
}

CollectiveRecordInfo all_reduce(uint64_t seq, uint64_t count = 256) {
  CollectiveRecordInfo i;
  i.op = "all_reduce";
  i.dtype = DataType::kFloat32;
  i.has_reduce_op = true;
  i.reduce_op = ReduceOp::kSum;
  i.count = count;
  i.seq = seq;
  return i;
}

std::string temp_dir() {
  std::string t = ::testing::TempDir() + "flight_recorder_XXXXXX";
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(FlightRecorder, RecordsStatesTimestampsAndTags) {
  FlightRecorder r(identity(), 8);
  r.set_tag("bucket=3 iter=120");
  const uint64_t a = r.record(all_reduce(1));
  r.started(a);
  r.finished(a, true);
  r.set_tag("");
  CollectiveRecordInfo b = all_reduce(2);
  b.op = "broadcast";
  b.has_reduce_op = false;
  b.root = 1;
  const uint64_t id_b = r.record(b);
  r.started(id_b);
  r.finished(id_b, false, "timed out after 3000 ms");
  r.record(all_reduce(3));
  const json d = json::parse(r.dump_json("test"));
  EXPECT_EQ(d["format"], "ddp-flight-recorder");
  EXPECT_EQ(d["reason"], "test");
  EXPECT_EQ(d["recorded"], 3);
  ASSERT_EQ(d["entries"].size(), 3u);
  const json& e0 = d["entries"][0];
  EXPECT_EQ(e0["seq"], 1);
  EXPECT_EQ(e0["op"], "all_reduce");
  EXPECT_EQ(e0["dtype"], "float32");
  EXPECT_EQ(e0["count"], 256);
  EXPECT_EQ(e0["reduce_op"], "sum");
  EXPECT_EQ(e0["state"], "completed");
  EXPECT_EQ(e0["tag"], "bucket=3 iter=120");
  EXPECT_LE(e0["queued_us"].get<int64_t>(), e0["started_us"].get<int64_t>());
  EXPECT_LE(e0["started_us"].get<int64_t>(), e0["ended_us"].get<int64_t>());
  const json& e1 = d["entries"][1];
  EXPECT_EQ(e1["op"], "broadcast");
  EXPECT_EQ(e1["root"], 1);
  EXPECT_FALSE(e1.contains("reduce_op"));
  EXPECT_FALSE(e1.contains("tag"));
  EXPECT_EQ(e1["state"], "failed");
  EXPECT_EQ(e1["error"], "timed out after 3000 ms");
  EXPECT_EQ(d["entries"][2]["state"], "queued");
  EXPECT_FALSE(d["entries"][2].contains("started_us"));
}

// The live progress ddprun's hang watchdog reads (progress_report.hpp): counts, and the
// oldest open operation, also after the ring wrapped past completed ones; two groups add up.
TEST(FlightRecorder, ProgressCountsCompletedAndNamesTheOldestOpenOperation) {
  FlightRecorder rec(identity(), 4);
  std::vector<uint64_t> ids;
  for (uint64_t s = 1; s <= 6; ++s) ids.push_back(rec.record(all_reduce(s)));
  for (int i : {0, 1, 2, 4}) rec.finished(ids[i], true);  // #4 (ids[3]) and #6 stay open
  rec.finished(ids[5], false, "boom");                    // a failure is not progress
  FlightRecorder::Progress p = rec.progress();
  EXPECT_EQ(p.issued, 6u);
  EXPECT_EQ(p.completed, 4u);
  EXPECT_EQ(p.open_op, "cpu:all_reduce");
  EXPECT_EQ(p.open_seq, 4u);
  EXPECT_GT(p.open_since_us, 0);
  rec.finished(ids[3], true);
  p = rec.progress();
  EXPECT_EQ(p.completed, 5u);
  EXPECT_EQ(p.open_op, "");
  EXPECT_EQ(p.open_since_us, 0);

  FlightRecorder other(identity(), 4);
  other.record(all_reduce(1));
  p.add(other.progress());
  EXPECT_EQ(p.issued, 7u);
  EXPECT_EQ(p.open_seq, 1u);
}

TEST(FlightRecorder, RingKeepsTheLastEntriesAndIgnoresOverwrittenIds) {
  FlightRecorder r(identity(), 3);
  std::vector<uint64_t> ids;
  for (uint64_t s = 1; s <= 5; ++s) ids.push_back(r.record(all_reduce(s)));
  r.finished(ids[0], false, "late");  // overwritten by seq 4: ignored
  r.started(ids[4]);
  const json d = json::parse(r.dump_json("x"));
  EXPECT_EQ(d["recorded"], 5);
  ASSERT_EQ(d["entries"].size(), 3u);
  EXPECT_EQ(d["entries"][0]["seq"], 3);
  EXPECT_EQ(d["entries"][2]["seq"], 5);
  EXPECT_EQ(d["entries"][2]["state"], "started");
  for (const auto& e : d["entries"]) EXPECT_FALSE(e.contains("error"));
}

TEST(FlightRecorder, ThreadTagWinsOverTheGroupTagOnItsThreadOnly) {
  FlightRecorder r(identity(), 8);
  r.set_tag("group");
  {
    FlightRecorder::ScopedThreadTag outer("DDP bucket 1, iteration 7");
    r.record(all_reduce(1));
    {
      FlightRecorder::ScopedThreadTag inner("inner");
      r.record(all_reduce(2));
    }
    r.record(all_reduce(3));
    std::thread([&] { r.record(all_reduce(4)); }).join();  // another thread: the group's tag
  }
  r.record(all_reduce(5));
  const json d = json::parse(r.dump_json("x"));
  std::vector<std::string> tags;
  for (const auto& e : d["entries"]) tags.push_back(e["tag"]);
  EXPECT_EQ(tags, (std::vector<std::string>{"DDP bucket 1, iteration 7", "inner",
                                            "DDP bucket 1, iteration 7", "group", "group"}));
}

TEST(FlightRecorder, LongTagsAreTruncated) {
  FlightRecorder r(identity(), 2);
  r.set_tag(std::string(200, 'x'));
  r.record(all_reduce(1));
  const json d = json::parse(r.dump_json("x"));
  EXPECT_EQ(d["entries"][0]["tag"].get<std::string>(),
            std::string(FlightRecorder::kTagBytes - 1, 'x'));
}

TEST(FlightRecorder, ZeroCapacityRecordsNothing) {
  FlightRecorder r(identity(), 0);
  EXPECT_FALSE(r.enabled());
  const uint64_t id = r.record(all_reduce(1));
  r.started(id);
  r.finished(id, true);
  EXPECT_TRUE(json::parse(r.dump_json("x"))["entries"].empty());
}

TEST(FlightRecorder, DumpToFileNamesGroupAndGlobalRank) {
  FlightRecorderIdentity id = identity(1, 2);
  id.group = "default_pg/0/sub0/";
  id.global_ranks = {2, 5};
  FlightRecorder r(id, 4);
  r.record(all_reduce(1));
  const std::string dir = temp_dir();
  const std::string path = r.dump_to_file("because", dir);
  EXPECT_EQ(path, dir + "/flight_recorder.default_pg_0_sub0.rank5.json");
  const json d = read_json(path);
  EXPECT_EQ(d["global_rank"], 5);
  EXPECT_EQ(d["rank"], 1);
  EXPECT_EQ(d["pid"], static_cast<int64_t>(::getpid()));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  // A missing directory is created; one below a regular file cannot be.
  const std::string nested = dir + "/a/b";
  EXPECT_EQ(r.dump_to_file("x", nested), nested + "/flight_recorder.default_pg_0_sub0.rank5.json");
  std::ofstream(dir + "/plain") << "x";
  try {
    r.dump_to_file("x", dir + "/plain/sub");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/plain/sub"), std::string::npos) << e.what();
  }
}

TEST(FlightRecorder, EntriesFromEnvironment) {
  {
    ScopedEnv e("DDP_FLIGHT_RECORDER_ENTRIES", nullptr);
    EXPECT_EQ(FlightRecorder::entries_from_env(), FlightRecorder::kDefaultEntries);
  }
  {
    ScopedEnv e("DDP_FLIGHT_RECORDER_ENTRIES", "0");
    EXPECT_EQ(FlightRecorder::entries_from_env(), 0u);
  }
  {
    ScopedEnv e("DDP_FLIGHT_RECORDER_ENTRIES", "-1");
    try {
      FlightRecorder::entries_from_env();
      FAIL() << "no exception";
    } catch (const UsageError& err) {
      EXPECT_NE(std::string(err.what()).find("DDP_FLIGHT_RECORDER_ENTRIES=-1"), std::string::npos);
    }
  }
}

// Rank 0 issues a second all_reduce that rank 1 never joins: rank 0 times out and dumps, rank
// 1 (idle, not in a collective) dumps through its watcher, both into DDP_FLIGHT_RECORDER_DIR.
TEST(FlightRecorderGroup, FailingAndIdleRanksBothDump) {
  for (const std::string backend : {"cpu", "gloo"}) {
    SCOPED_TRACE(backend);
    const std::string dir = temp_dir();
    ScopedEnv d("DDP_FLIGHT_RECORDER_DIR", dir.c_str());
    ScopedEnv n("DDP_FLIGHT_RECORDER_ENTRIES", "16");
    auto store = std::make_shared<HashStore>();
    std::string error0;
    auto run = [&](int rank) {
      InitOptions o;
      o.backend = backend;
      o.store = store;
      o.rank = rank;
      o.world_size = 2;
      o.timeout = std::chrono::milliseconds(1000);
      auto pg = init_process_group(o);
      ASSERT_NE(pg->flight_recorder(), nullptr);
      pg->set_call_tag("iter=1");
      std::vector<float> buf(64, 1.0f);
      pg->all_reduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)
          ->wait(pg->timeout());
      if (rank == 0) {
        pg->set_call_tag("iter=2");
        try {
          pg->all_reduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)
              ->wait(pg->timeout());
        } catch (const std::exception& e) {
          error0 = e.what();
        }
      } else {
        // Idle until the watcher wrote this rank's record (bounded).
        const std::string mine = dir + "/flight_recorder.default_pg_0.rank1.json";
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!std::filesystem::exists(mine) && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
    };
    std::thread t1([&] { run(1); });
    run(0);
    t1.join();
    EXPECT_NE(error0.find("all_reduce"), std::string::npos) << error0;
    const json r0 = read_json(dir + "/flight_recorder.default_pg_0.rank0.json");
    const json r1 = read_json(dir + "/flight_recorder.default_pg_0.rank1.json");
    EXPECT_EQ(r0["backend"], backend);
    ASSERT_EQ(r0["entries"].size(), 2u);
    EXPECT_EQ(r0["entries"][1]["seq"], 2);
    EXPECT_EQ(r0["entries"][1]["state"], "failed");
    EXPECT_EQ(r0["entries"][1]["tag"], "iter=2");
    EXPECT_NE(r0["reason"].get<std::string>().find("failed on rank 0"), std::string::npos);
    ASSERT_EQ(r1["entries"].size(), 1u);
    EXPECT_EQ(r1["entries"][0]["state"], "completed");
    EXPECT_NE(r1["reason"].get<std::string>().find("requested by a peer"), std::string::npos);
  }
}

// Sends and receives are recorded (peer in "root", no sequence number), so a receive whose
// sender never came is in the dump and ddprun's hang report: on the cpu backend within a host
// (shared memory) and between hosts (Gloo's unbound buffers, which learn of completion only when
// waited on), and on the gloo backend.
struct P2PPath {
  const char* name;
  const char* backend;
  bool two_hosts;
};

class FlightRecorderP2P : public ::testing::TestWithParam<P2PPath> {};

INSTANTIATE_TEST_SUITE_P(Paths, FlightRecorderP2P,
                         ::testing::Values(P2PPath{"cpu_same_host", "cpu", false},
                                           P2PPath{"cpu_two_hosts", "cpu", true},
                                           P2PPath{"gloo", "gloo", false}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_P(FlightRecorderP2P, PointToPointIsRecordedWithItsPeer) {
  ScopedEnv n("DDP_FLIGHT_RECORDER_ENTRIES", "16");
  const P2PPath path = GetParam();
  auto store = std::make_shared<HashStore>();
  json dump;
  std::atomic<bool> rank0_done{false};
  auto run = [&](int rank) {
    InitOptions o;
    o.backend = path.backend;
    o.store = store;
    o.rank = rank;
    o.world_size = 2;
    o.timeout = std::chrono::milliseconds(500);
    o.host_id = path.two_hosts ? "host" + std::to_string(rank) : "host";
    auto pg = init_process_group(o);
    std::vector<float> buf(4, 1.0f);
    if (rank == 0) {
      pg->send(buf.data(), 4, DataType::kFloat32, 1, 7)->wait(std::chrono::seconds(10));
      // Rank 1 never sends. Within a host the receive fails after the group's 500 ms; Gloo's
      // stays posted, and this wait gives up after 1 s.
      try {
        pg->recv(buf.data(), 4, DataType::kFloat32, 1, 8)->wait(std::chrono::seconds(1));
      } catch (const std::exception&) {
      }
      dump = json::parse(pg->flight_recorder()->dump_json("test"));
      rank0_done = true;
    } else {
      pg->recv(buf.data(), 4, DataType::kFloat32, 0, 7)->wait(std::chrono::seconds(10));
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!rank0_done && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  };
  std::thread t1([&] { run(1); });
  run(0);
  t1.join();
  ASSERT_EQ(dump["entries"].size(), 2u) << dump.dump();
  EXPECT_EQ(dump["entries"][0]["op"], "send");
  EXPECT_EQ(dump["entries"][0]["root"], 1);
  EXPECT_EQ(dump["entries"][0]["state"], "completed");
  EXPECT_EQ(dump["entries"][1]["op"], "recv");
  EXPECT_EQ(dump["entries"][1]["root"], 1);
  EXPECT_EQ(dump["entries"][1]["count"], 4);
  const bool same_host = std::string(path.backend) == "cpu" && !path.two_hosts;
  EXPECT_EQ(dump["entries"][1]["state"], same_host ? "failed" : "started");
}
