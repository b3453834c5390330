// The hang report on hand-made flight recorder dumps: a rank behind, a mismatch, a dead rank,
// a rank frozen inside a collective, all ranks stuck together, nothing wrong, and parsing.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/hang_report.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/remove_tree.hpp"

using namespace ddp::launcher;

namespace {

constexpr int64_t kT0 = 1'700'000'000'000'000;  // Unix time in us

FlightEntry entry(uint64_t seq, const std::string& state, const std::string& op = "all_reduce",
                  uint64_t count = 256) {
  FlightEntry e;
  e.seq = seq;
  e.op = op;
  e.dtype = "float32";
  e.count = count;
  if (op == "all_reduce") e.reduce_op = "sum";
  if (op == "broadcast") e.root = 0;
  e.state = state;
  e.queued_us = kT0 + seq * 1000;
  if (state != "queued") e.started_us = e.queued_us + 10;
  if (state == "completed" || state == "failed") e.ended_us = e.started_us + 100;
  return e;
}

// A rank that completed collectives 1..done, then `open` (if any) in `open_state`.
FlightDump rank_dump(int rank, int size, uint64_t done, const std::string& open_state = "",
                     const std::string& open_op = "all_reduce") {
  FlightDump d;
  d.rank = d.global_rank = rank;
  d.group_size = size;
  d.pid = 100 + rank;
  d.host = "node";
  for (uint64_t s = 1; s <= done; ++s) d.entries.push_back(entry(s, "completed"));
  if (!open_state.empty()) {
    FlightEntry e = entry(done + 1, open_state, open_op);
    e.started_us = kT0 + 1'000'000;  // 6 s before the dump
    d.entries.push_back(e);
  }
  d.recorded = d.entries.size();
  d.dumped_at_us = kT0 + 7'000'000;
  return d;
}

std::string all(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

}  // namespace

TEST(HangReport, RankBehindIsNamedWithItsLastAndTheOthersCollective) {
  const auto lines = analyze_hang(
      {rank_dump(0, 3, 12, "started"), rank_dump(1, 3, 12), rank_dump(2, 3, 12, "started")});
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0],
            "hang report: rank 1 is behind: its last collective was all_reduce #12 (float32 x "
            "256, sum, completed); ranks 0,2 wait in all_reduce #13 since 6.0 s")
      << all(lines);
  EXPECT_NE(all(lines).find("alive: it wrote its record"), std::string::npos) << all(lines);
}

TEST(HangReport, MismatchNamesBothCalls) {
  const auto lines = analyze_hang({rank_dump(0, 3, 12, "failed"), rank_dump(1, 3, 12, "failed"),
                                   rank_dump(2, 3, 12, "failed", "broadcast")});
  EXPECT_EQ(lines[0],
            "hang report: mismatch at collective #13: ranks 0,1 called all_reduce (float32 x 256, "
            "sum) but rank 2 called broadcast (float32 x 256, root 0); every rank must issue the "
            "same collectives in the same order")
      << all(lines);
}

TEST(HangReport, CountMismatchAtOneSequenceNumber) {
  FlightDump a = rank_dump(0, 2, 3), b = rank_dump(1, 2, 3);
  b.entries[1].count = 512;
  const auto lines = analyze_hang({a, b});
  EXPECT_NE(lines[0].find("mismatch at collective #2"), std::string::npos) << all(lines);
  EXPECT_NE(lines[0].find("float32 x 512"), std::string::npos) << all(lines);
}

TEST(HangReport, RankWithoutDumpDied) {
  const auto lines = analyze_hang({rank_dump(0, 3, 12, "started"), rank_dump(1, 3, 12, "started")});
  EXPECT_EQ(lines[0],
            "hang report: rank 2 wrote no record (died, or could not reach the store); ranks 0,1 "
            "wait in all_reduce #13 since 6.0 s")
      << all(lines);
}

TEST(HangReport, LauncherViewTellsDiedFromFrozen) {
  RankProcess died;
  died.global_rank = 2;
  died.pid = 77;
  died.host = "node";
  died.state = RankProcess::State::kExited;
  died.exit = "was killed by SIGKILL";
  died.at_us = kT0 + 5'000'000;  // 2 s before the dumps
  RankProcess stopped = died;
  stopped.state = RankProcess::State::kStopped;
  const std::vector<FlightDump> dumps = {rank_dump(0, 3, 12, "started"),
                                         rank_dump(1, 3, 12, "started")};
  EXPECT_EQ(analyze_hang(dumps, {died})[0],
            "hang report: rank 2 died: its process (pid 77 on node) was killed by SIGKILL 2.0 s "
            "before the first record was written and wrote no record; ranks 0,1 wait in "
            "all_reduce #13 since 6.0 s");
  EXPECT_EQ(analyze_hang(dumps, {stopped})[0],
            "hang report: rank 2 is frozen: its process (pid 77 on node) is alive but stopped "
            "(SIGSTOP, job control or a debugger), so it could not write its record; ranks 0,1 "
            "wait in all_reduce #13 since 6.0 s");
  RankProcess alive = stopped;
  alive.state = RankProcess::State::kRunning;
  EXPECT_NE(analyze_hang(dumps, {alive})[0].find("rank 2 is frozen: its process (pid 77 on node) "
                                                 "is alive but made no progress"),
            std::string::npos);
}

TEST(HangReport, CallerTagNamesTheCollective) {
  FlightDump a = rank_dump(0, 2, 12, "started"), b = rank_dump(1, 2, 12);
  a.entries.back().tag = "DDP bucket 2, iteration 7";
  b.entries.back().tag = "DDP bucket 1, iteration 7";
  EXPECT_EQ(analyze_hang({a, b})[0],
            "hang report: rank 1 is behind: its last collective was all_reduce #12 (float32 x "
            "256, sum, completed; DDP bucket 1, iteration 7); rank 0 waits in all_reduce #13 "
            "(DDP bucket 2, iteration 7) since 6.0 s");
}

TEST(HangReport, ProcessStateOfThisProcessAndAGoneOne) {
  EXPECT_EQ(process_state(::getpid()), RankProcess::State::kRunning);
  EXPECT_EQ(process_state(1 << 30), RankProcess::State::kExited);
}

TEST(HangReport, RankFrozenInsideAnOlderCollective) {
  // Rank 1 started #12 but never finished it while the others completed it and moved on.
  FlightDump frozen = rank_dump(1, 3, 11, "started");
  const auto lines =
      analyze_hang({rank_dump(0, 3, 12, "started"), frozen, rank_dump(2, 3, 12, "started")});
  EXPECT_NE(lines[0].find("rank 1 is behind"), std::string::npos) << all(lines);
  EXPECT_NE(all(lines).find("rank 1 is behind and frozen in all_reduce #12"), std::string::npos)
      << all(lines);
}

TEST(HangReport, AllRanksStuckInOneCollective) {
  FlightDump a = rank_dump(0, 2, 4, "failed"), b = rank_dump(1, 2, 4, "failed");
  a.entries.back().error = "connection reset by peer";
  const auto lines = analyze_hang({a, b});
  EXPECT_NE(lines[0].find("no rank is behind"), std::string::npos) << all(lines);
  EXPECT_NE(lines[0].find("ranks 0,1 wait in all_reduce #5"), std::string::npos) << all(lines);
  EXPECT_NE(lines[0].find("connection reset by peer"), std::string::npos) << all(lines);
}

TEST(HangReport, NothingWrong) {
  const auto lines = analyze_hang({rank_dump(0, 2, 4), rank_dump(1, 2, 4)});
  EXPECT_EQ(lines[0], "hang report: no hang found: every rank completed collective #4");
  EXPECT_EQ(analyze_hang({rank_dump(0, 1, 0)})[0], "hang report: no collective recorded");
}

TEST(HangReport, SeveralGroupsWorstFirst) {
  FlightDump sub0 = rank_dump(0, 2, 3), sub1 = rank_dump(1, 2, 3);
  sub0.group = sub1.group = "default_pg/0/sub0/";
  const auto lines = analyze_hang({sub0, sub1, rank_dump(0, 2, 5, "started"), rank_dump(1, 2, 4)});
  EXPECT_NE(lines[0].find("rank 1 is behind"), std::string::npos) << all(lines);
  EXPECT_NE(lines[0].find("(group default_pg/0/)"), std::string::npos) << all(lines);
  EXPECT_NE(all(lines).find("group default_pg/0/sub0/: no hang found"), std::string::npos)
      << all(lines);
}

TEST(HangReport, ParsesTheRecorderFormatAndRejectsOthers) {
  const std::string json = R"({"format":"ddp-flight-recorder","version":1,"group":"g/0/",
    "backend":"cpu","rank":1,"global_rank":3,"group_size":2,"global_ranks":[2,3],"pid":7,
    "host":"h","reason":"r","dumped_at_us":5,"capacity":10,"recorded":1,
    "entries":[{"seq":1,"op":"broadcast","dtype":"int64","count":4,"root":1,
    "state":"started","queued_us":1,"started_us":2,"tag":"bucket=0 iter=3"}]})";
  const FlightDump d = parse_flight_dump(json, "x.json");
  EXPECT_EQ(d.global_rank, 3);
  EXPECT_EQ(d.group, "g/0/");
  ASSERT_EQ(d.entries.size(), 1u);
  EXPECT_EQ(d.entries[0].root, 1);
  EXPECT_EQ(d.entries[0].tag, "bucket=0 iter=3");
  EXPECT_EQ(d.entries[0].reduce_op, "");
  try {
    parse_flight_dump(R"({"hello":1})", "bad.json");
    FAIL() << "no exception";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json: not a flight recorder dump"),
              std::string::npos);
  }
  EXPECT_THROW(parse_flight_dump("{", "broken.json"), ddp::UsageError);
  EXPECT_THROW(read_flight_dumps({"/nonexistent/flight"}), ddp::UsageError);
}

namespace {

// A dump file as FlightRecorder writes it: `done` completed all_reduces, then #done+1 started
// when `open`.
void write_dump(const std::string& dir, int rank, int size, int done, bool open) {
  std::string entries;
  for (int s = 1; s <= done + (open ? 1 : 0); ++s) {
    const bool last_open = open && s == done + 1;
    entries += (entries.empty() ? "" : ",") + std::string(R"({"seq":)") + std::to_string(s) +
               R"(,"op":"all_reduce","dtype":"float32","count":256,"reduce_op":"sum","state":")" +
               (last_open ? "started" : "completed") + R"(","queued_us":1,"started_us":2})";
  }
  std::ofstream(dir + "/flight_recorder.default_pg_0.rank" + std::to_string(rank) + ".json")
      << R"({"format":"ddp-flight-recorder","version":1,"group":"default_pg/0/","rank":)" << rank
      << R"(,"global_rank":)" << rank << R"(,"group_size":)" << size
      << R"(,"pid":1,"host":"h","dumped_at_us":3000000,"recorded":)" << done + (open ? 1 : 0)
      << R"(,"entries":[)" << entries << "]}";
}

}  // namespace

// Multi-node: each agent packs its folder's dumps and its processes; the report over both
// nodes' packs sees every rank, counts a dump two nodes both hold once, and keeps each dump's
// last kSharedEntries entries.
TEST(HangReport, NodeRecordsCombineIntoOneReport) {
  std::string base = ::testing::TempDir() + "hang_nodes_XXXXXX";
  ASSERT_NE(::mkdtemp(base.data()), nullptr);
  const std::string a = base + "/a", b = base + "/b";
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  write_dump(a, 0, 3, 500, true);
  write_dump(a, 1, 3, 500, true);
  write_dump(b, 1, 3, 500, true);  // a shared log dir: the same rank seen by both nodes
  write_dump(b, 2, 3, 500, false);
  RankProcess p;
  p.global_rank = 2;
  p.pid = 9;
  p.host = "b";
  p.state = RankProcess::State::kStopped;
  const std::string pack_a = encode_node_records(a, {}, "a");
  const std::string pack_b = encode_node_records(b, {p}, "b");
  EXPECT_EQ(encode_node_records(base + "/none", {}, "c"), "");
  const auto lines = hang_report_for_nodes({pack_a, pack_b, ""});
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("hang report: rank 2 is behind: its last collective was all_reduce "
                           "#500 (float32 x 256, sum, completed); ranks 0,1 wait in all_reduce "
                           "#501",
                           0),
            0u)
      << all(lines);
  EXPECT_NE(all(lines).find("its process is stopped now"), std::string::npos) << all(lines);
  EXPECT_NE(all(lines).find(", b:" + b + "/flight_recorder.default_pg_0.rank2.json"),
            std::string::npos)
      << all(lines);
  size_t rank1_lines = 0;
  for (const auto& l : lines) rank1_lines += l.rfind("  rank 1 ", 0) == 0 ? 1 : 0;
  EXPECT_EQ(rank1_lines, 1u) << all(lines);
  EXPECT_EQ(nlohmann::json::parse(pack_a)["dumps"][0]["dump"]["entries"].size(), kSharedEntries);
  EXPECT_NE(hang_report_for_nodes({"{not json"})[0].find("could not be read"), std::string::npos);
  ddp::remove_tree(base);
}

TEST(HangReportCli, TraceSubcommandTakesPaths) {
  const EnvLookup no_env = [](const std::string&) -> std::optional<std::string> {
    return std::nullopt;
  };
  const ParsedCommandLine p = parse_command_line({"trace", "a.json", "logs/run"}, no_env);
  ASSERT_TRUE(p.trace.has_value());
  EXPECT_FALSE(p.options.has_value());
  EXPECT_EQ(p.trace->paths, (std::vector<std::string>{"a.json", "logs/run"}));
  EXPECT_THROW(parse_command_line({"trace"}, no_env), ddp::UsageError);
  EXPECT_NE(parse_command_line({"trace", "--help"}, no_env).help.find("paths"), std::string::npos);
}

// A receive whose sender never came, while every collective completed: the report names the
// receiving rank, its peer and the message (point-to-point entries carry no sequence number
// and stay out of the collectives' comparison: no false mismatch at #0).
TEST(HangReport, PendingReceiveIsNamedWithItsPeer) {
  FlightDump r0 = rank_dump(0, 2, 5), r1 = rank_dump(1, 2, 5);
  FlightEntry recv = entry(0, "started", "recv", 4);
  recv.root = 0;  // the peer
  recv.started_us = kT0 + 1'000'000;
  r1.entries.push_back(recv);
  FlightEntry send = entry(0, "completed", "send", 4);
  send.root = 1;
  r0.entries.push_back(send);
  const auto lines = analyze_hang({r0, r1});
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("rank 1 waits in recv from rank 0 (float32 x 4) since 6.0 s"),
            std::string::npos)
      << all(lines);
  EXPECT_EQ(all(lines).find("mismatch"), std::string::npos) << all(lines);
  EXPECT_EQ(all(lines).find("different"), std::string::npos) << all(lines);
}

// A recv from any source is recorded with the peer -1 (comm.md): named as such, not looked up
// as a rank.
TEST(HangReport, PendingReceiveFromAnySourceIsNamedSo) {
  FlightDump r0 = rank_dump(0, 2, 5), r1 = rank_dump(1, 2, 5);
  r0.global_ranks = r1.global_ranks = {0, 1};  // before: global_ranks[-1] was read
  FlightEntry recv = entry(0, "started", "recv", 4);
  recv.root = -1;
  recv.started_us = kT0 + 1'000'000;
  r1.entries.push_back(recv);
  const auto lines = analyze_hang({r0, r1});
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("rank 1 waits in recv from any rank (float32 x 4) since 6.0 s"),
            std::string::npos)
      << all(lines);
}
