// Unit tests of the stack model (stacks.hpp), the hang watchdog (hang_watchdog.hpp), the
// progress records (torch_progress.hpp) and PyTorch flight recorder dumps (hang_report.hpp).
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "ddp/launcher/hang_report.hpp"
#include "ddp/launcher/hang_watchdog.hpp"
#include "ddp/launcher/process.hpp"
#include "ddp/launcher/root_cause.hpp"
#include "ddp/launcher/stack_capture.hpp"
#include "ddp/launcher/stack_service.hpp"
#include "ddp/launcher/stacks.hpp"
#include "ddp/launcher/torch_progress.hpp"
#include "ddp/util/error.hpp"
#include "stacks_with_tools.hpp"

namespace ddp::launcher {
namespace {

using testing::StacksWithTools;

RankStacks python_rank(int rank, const std::string& top, int top_line) {
  RankStacks s;
  s.global_rank = rank;
  s.pid = 100 + rank;
  s.host = "node";
  s.tool = "py-spy";
  ThreadStack t;
  t.tid = s.pid;
  t.name = "MainThread";
  if (top == "all_reduce") {
    t.frames.push_back({"all_reduce",
                        "/venv/lib/python3.11/site-packages/torch/distributed/"
                        "distributed_c10d.py",
                        3252});
  }
  t.frames.push_back({top == "all_reduce" ? "main" : top, "/job/train.py", top_line});
  t.frames.push_back({"<module>", "/job/train.py", 99});
  s.threads.push_back(t);
  return s;
}

TEST(Stacks, IdenticalStacksFoldAndTheOddRankComesFirst) {
  std::vector<RankStacks> stacks = {
      python_rank(0, "all_reduce", 88), python_rank(3, "all_reduce", 88),
      python_rank(1, "slow_rank", 3), python_rank(2, "all_reduce", 88)};
  // Different pids (and so main-thread tids) must not keep identical stacks apart.
  ASSERT_NE(stacks[0].pid, stacks[1].pid);
  const auto groups = fold_stacks(stacks);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].ranks, std::vector<int>({1}));
  EXPECT_EQ(groups[1].ranks, std::vector<int>({0, 2, 3}));
  EXPECT_EQ(stacks_summary(stacks),
            "rank 1 was in slow_rank at train.py:3; ranks 0,2,3 were in all_reduce called from "
            "train.py:88");
}

TEST(Stacks, DifferentLinesDoNotFold) {
  std::vector<RankStacks> stacks = {python_rank(0, "all_reduce", 88),
                                    python_rank(1, "all_reduce", 90)};
  EXPECT_EQ(fold_stacks(stacks).size(), 2u);
}

TEST(Stacks, UnreadableRanksComeLast) {
  RankStacks bad;
  bad.global_rank = 0;
  bad.error = "ptrace was refused";
  std::vector<RankStacks> stacks = {bad, python_rank(1, "all_reduce", 88),
                                    python_rank(2, "all_reduce", 88)};
  const auto groups = fold_stacks(stacks);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].ranks, std::vector<int>({0}));
  const auto lines = format_folded(stacks);
  EXPECT_EQ(lines.back(), "rank 0 (1 of 3): no stack: ptrace was refused");
}

TEST(Stacks, RankListsUseRanges) {
  EXPECT_EQ(rank_list_text({3}), "rank 3");
  EXPECT_EQ(rank_list_text({2, 0, 1, 5}), "ranks 0-2,5");
  EXPECT_EQ(rank_list_text({0, 1, 4, 5}), "ranks 0,1,4,5");
}

TEST(Stacks, ParsesPySpyJson) {
  const std::string text = R"([{"pid": 7, "thread_id": 1, "thread_name": "MainThread",
    "os_thread_id": 7, "active": false, "owns_gil": false, "frames": [
    {"name": "slow_rank", "filename": "/tmp/hang.py", "module": null, "short_filename": "hang.py",
     "line": 3, "locals": null, "is_entry": false},
    {"name": "<module>", "filename": "/tmp/hang.py", "line": 11}]}])";
  const auto threads = parse_py_spy_json(text);
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads[0].tid, 7);
  EXPECT_EQ(threads[0].name, "MainThread");
  ASSERT_EQ(threads[0].frames.size(), 2u);
  EXPECT_EQ(threads[0].frames[0].function, "slow_rank");
  EXPECT_EQ(threads[0].frames[0].line, 3);
  EXPECT_TRUE(parse_py_spy_json("Error: Permission Denied").empty());
}

TEST(Stacks, ParsesEuStackAndNamesTheNativeCaller) {
  const std::string text =
      "PID 42 - process\nTID 42:\n#0  0x00007f38b2aed545 clock_nanosleep@GLIBC_2.2.5\n"
      "#1  0x00007f38b2f15ada __nanosleep\n#2  0x000055f416de5081 train_step(int)\n"
      "#3  0x000055f416de5081 main\nTID 43:\n#0  0x00007f38b2b26f36 epoll_wait\n"
      "#1  0x00007f38a477d62d gloo::transport::tcp::Loop::run()\n#2  0x00007f389b8d44a3\n";
  RankStacks s;
  s.pid = 42;
  s.threads = parse_eu_stack(text);
  ASSERT_EQ(s.threads.size(), 2u);
  EXPECT_EQ(s.threads[1].tid, 43);
  EXPECT_EQ(s.threads[1].frames.back().function, "??");
  EXPECT_EQ(where_text(s), "clock_nanosleep@GLIBC_2.2.5 called from train_step(int)");
}

TEST(Stacks, SurviveTheirJsonTransport) {
  std::vector<RankStacks> stacks = {python_rank(0, "all_reduce", 88)};
  stacks[0].error = "";
  const auto back = decode_stacks(encode_stacks(stacks));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(stacks_summary(back), stacks_summary(stacks));
  EXPECT_THROW(decode_stacks("[{\"rank\": 0}]"), ProtocolError);
}

// Thread names from /proc are cut at 15 bytes, which may split a UTF-8 character; frames are
// whatever the tool printed. Neither may make the encoder throw (nlohmann's type_error 316).
TEST(Stacks, InvalidUtf8IsEncodedNotThrown) {
  std::vector<RankStacks> stacks = {python_rank(0, "all_reduce", 88)};
  stacks[0].threads[0].name = "worker-\xe2\x82";  // "€" cut after two of its three bytes
  stacks[0].threads[0].frames[0].function = "f\xff\xfe";
  std::string text;
  ASSERT_NO_THROW(text = encode_stacks(stacks));
  std::vector<RankStacks> back;
  ASSERT_NO_THROW(back = decode_stacks(text));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].threads[0].name, "worker-\xef\xbf\xbd");  // U+FFFD
  EXPECT_EQ(back[0].threads[0].frames[0].function.rfind("f", 0), 0u);
}

// A tool that another user could have replaced is never run with ptrace rights: on the
// search path it is skipped with its reason; one of this user's, not writable by others, is
// used.
TEST(StackTools, AToolOthersCanWriteIsSkippedWithItsReason) {
  char tmpl[] = "/tmp/ddp-tools-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string tool = dir + "/eu-stack";
  std::ofstream(tool) << "#!/bin/sh\n";
  ASSERT_EQ(::chmod(tool.c_str(), 0777), 0);
  EXPECT_EQ(untrusted_tool_reason(tool), "other users may write it (mode 777)");
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  ::setenv("PATH", dir.c_str(), 1);
  ::unsetenv("DDPRUN_EU_STACK");
  EXPECT_EQ(find_stack_tools().eu_stack, "");  // skipped, though first on PATH
  ASSERT_EQ(::chmod(tool.c_str(), 0755), 0);
  EXPECT_EQ(untrusted_tool_reason(tool), "");
  EXPECT_EQ(find_stack_tools().eu_stack, tool);
  ::setenv("PATH", saved.c_str(), 1);
  ::unlink(tool.c_str());
  ::rmdir(dir.c_str());
}

// The whole path is checked (issue 49, finding 3): a folder above the tool that others can
// write (not sticky) makes it untrusted; $DDPRUN_EU_STACK is checked too; relative PATH entries
// are never searched.
TEST(StackTools, EveryFolderAboveTheToolAndTheVariablesAreChecked) {
  char tmpl[] = "/tmp/ddp-tools-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(::mkdir((dir + "/open").c_str(), 0755), 0);
  const std::string tool = dir + "/open/eu-stack";
  std::ofstream(tool) << "#!/bin/sh\n";
  ASSERT_EQ(::chmod(tool.c_str(), 0755), 0);
  EXPECT_EQ(untrusted_tool_reason(tool), "");
  ASSERT_EQ(::chmod((dir + "/open").c_str(), 0777), 0);
  EXPECT_EQ(untrusted_tool_reason(tool),
            "other users may write the folder " + dir + "/open (mode 777)");
  ASSERT_EQ(::chmod((dir + "/open").c_str(), 01777), 0);  // sticky: nothing in it is replaceable
  EXPECT_EQ(untrusted_tool_reason(tool), "");
  ASSERT_EQ(::chmod((dir + "/open").c_str(), 0777), 0);

  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  ::setenv("DDPRUN_EU_STACK", tool.c_str(), 1);
  EXPECT_EQ(find_stack_tools().eu_stack, "");  // the variable's tool is checked and refused
  ::unsetenv("DDPRUN_EU_STACK");
  // A relative PATH entry is never searched, even where it names a trusted tool.
  ASSERT_EQ(::chmod((dir + "/open").c_str(), 0755), 0);
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir((dir + "/open").c_str()), 0);
  ::setenv("PATH", ".", 1);
  EXPECT_EQ(find_stack_tools().eu_stack, "");
  ASSERT_EQ(::chdir(cwd), 0);
  ::setenv("PATH", (dir + "/open").c_str(), 1);
  EXPECT_EQ(find_stack_tools().eu_stack, tool);
  ::setenv("PATH", saved.c_str(), 1);
  ::unlink(tool.c_str());
  ::rmdir((dir + "/open").c_str());
  ::rmdir(dir.c_str());
}

// What runs is the file that was checked, whatever its path names by then.
TEST(StackTools, TheCheckedFileRunsEvenWhenThePathIsReplaced) {
  char tmpl[] = "/tmp/ddp-tools-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string tool = dir + "/eu-stack";
  auto fake = [&](const std::string& path, const std::string& function) {
    std::ofstream(path) << "#!/bin/sh\necho \"TID $2:\"\necho \"#0  0x0000000000001000 " << function
                        << "\"\n";
    ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
  };
  fake(tool, "the_checked_tool");
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  ::setenv("PATH", dir.c_str(), 1);
  ::unsetenv("DDPRUN_EU_STACK");
  const StackTools tools = find_stack_tools();
  ::setenv("PATH", saved.c_str(), 1);
  ASSERT_EQ(tools.eu_stack, tool);
  fake(dir + "/other", "a_replacement");
  ASSERT_EQ(::rename((dir + "/other").c_str(), tool.c_str()), 0);

  StackTarget self;
  self.pid = ::getpid();
  const auto got = capture_stacks({self}, "host", tools,
                                  std::chrono::steady_clock::now() + std::chrono::seconds(10));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].error, "");
  ASSERT_FALSE(got[0].threads.empty());
  ASSERT_FALSE(got[0].threads[0].frames.empty());
  EXPECT_EQ(got[0].threads[0].frames[0].function, "the_checked_tool");
  ::unlink(tool.c_str());
  ::rmdir(dir.c_str());
}

TEST(RootCause, ATemporaryStacksFileIsNotNamed) {
  FailureReport r;
  r.role = "default";
  r.run_id = "x";
  r.stacks_summary = "rank 0 was in f at a.py:1";
  r.stacks_file = "/tmp/ddprun-abc/attempt_0/stacks.node.txt";
  r.stacks_file_kept = false;
  std::string text = format_failure_report(r);
  EXPECT_EQ(text.find(r.stacks_file), std::string::npos) << text;
  EXPECT_NE(text.find("rerun with --log-dir DIR"), std::string::npos) << text;
  r.stacks_file_kept = true;
  text = format_failure_report(r);
  EXPECT_NE(text.find("every stack: " + r.stacks_file), std::string::npos) << text;
}

// The tool printed a line and then hangs: the capture still ends at its deadline, kills the
// tool and says so (a blocking pipe used to hold it until the tool exited, 60 s here).
TEST_F(StacksWithTools, AToolThatPrintsThenHangsIsStoppedAtTheDeadline) {
  StackTools tools;
  tools.eu_stack = tool("eu-stack", "echo 'PID 1 - process'\nexec sleep 60");
  const auto started = std::chrono::steady_clock::now();
  const auto stacks =
      capture_stacks({{0, ::getpid()}}, "node", tools, started + std::chrono::milliseconds(1500));
  ASSERT_EQ(stacks.size(), 1u);
  EXPECT_NE(stacks[0].error.find("eu-stack did not answer in time"), std::string::npos)
      << stacks[0].error;
  // Generous: it must not have waited for the tool's 60 s.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
}

int connect_to(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_request(int fd, int64_t timeout_ms) {
  const std::string line =
      nlohmann::json{{"timeout_ms", timeout_ms}, {"all_nodes", true}}.dump() + "\n";
  ASSERT_EQ(::write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
}

// The whole answer, or "" when it did not come within `limit`.
std::string read_answer(int fd, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::string text;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return "";
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return text;
    text.append(buf, static_cast<size_t>(n));
  }
}

// A client that asks and never reads a large answer must not wedge the service: the next
// client is answered, and the service's destructor returns.
TEST_F(StacksWithTools, AClientThatDoesNotReadDoesNotWedgeTheService) {
  StackServiceOptions so;
  so.run_id = "wedge";
  so.host = "node";
  // Some megabytes of stack: more than a Unix socket buffers.
  so.tools.eu_stack = tool("eu-stack",
                           "awk 'BEGIN { print \"PID 1 - process\"; print \"TID 1:\"; "
                           "for (i = 0; i < 40000; i++) printf \"#%d  0x00007f38b2aed545 "
                           "function_number_%d(int, char const*)\\n\", i, i }'");
  auto service = std::make_unique<StackService>(so);
  service->set_workers({{0, ::getpid()}, {1, ::getpid()}});
  UniqueFd idle(connect_to(service->socket_path()));
  ASSERT_TRUE(idle.valid());
  send_request(idle.get(), 3000);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  UniqueFd second(connect_to(service->socket_path()));
  ASSERT_TRUE(second.valid());
  send_request(second.get(), 3000);
  const std::string text = read_answer(second.get(), std::chrono::seconds(30));
  ASSERT_FALSE(text.empty()) << "the service did not answer a second client";
  const auto answer = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(answer.is_object()) << text.size() << " bytes";
  EXPECT_EQ(answer["stacks"].size(), 2u);
  service.reset();  // with `idle` still connected and unread
}

// Two captures of the same workers at the same moment (a node's own failure report and another
// node's request, when a round ends): a process admits one tracer, so the second tracer fails
// (the fake eu-stack below refuses while another holds the pid, as ptrace does). The service
// runs one capture at a time and the later one takes its result: both read every worker.
// Before, one of the two reports lacked the ranks (the flaky two-node stacks tests).
TEST_F(StacksWithTools, CapturesAtTheSameMomentShareOneTraceOfEachWorker) {
  StackServiceOptions so;
  so.run_id = "overlap";
  so.host = "node";
  so.tools.eu_stack = tool(
      "eu-stack", "lock=" + dir_ +
                      "/traced.$2\n"
                      "mkdir \"$lock\" 2>/dev/null || { echo \"eu-stack: dwfl_linux_proc_attach "
                      "pid $2: Operation not permitted\" >&2; exit 1; }\n"
                      "sleep 0.5\n"
                      "echo \"PID $2 - process\"; echo \"TID $2:\"; "
                      "echo \"#0  0x00007f38b2aed545 wait_here\"\n"
                      "rmdir \"$lock\"");
  StackService service(so);
  service.set_workers({{0, ::getpid()}});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::vector<RankStacks> first, second;
  std::thread other([&] { first = service.capture_local(deadline); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the first tool holds the pid
  second = service.capture_local(deadline);
  other.join();
  for (const auto* got : {&first, &second}) {
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].error, "");
    ASSERT_FALSE((*got)[0].threads.empty());
  }
}

// Without a store (etcd, or one without auth token) the other nodes of a round are not
// asked: the answer counts them all and says why, so `ddprun stacks` does not report
// "1 of 1 nodes" on a 4-node job.
TEST_F(StacksWithTools, OtherNodesWithoutAStoreAreCountedAndExplained) {
  StackServiceOptions so;
  so.run_id = "nostore";
  so.host = "node";
  StackService service(so);
  service.join_round(nullptr, 0, 0, 4, "the other nodes cannot be asked: etcd");
  UniqueFd client(connect_to(service.socket_path()));
  ASSERT_TRUE(client.valid());
  send_request(client.get(), 1000);
  const auto answer =
      nlohmann::json::parse(read_answer(client.get(), std::chrono::seconds(20)), nullptr, false);
  ASSERT_TRUE(answer.is_object());
  EXPECT_EQ(answer["nodes"], 4);
  EXPECT_EQ(answer["answered"], nlohmann::json::array({0}));
  EXPECT_EQ(answer["notes"], nlohmann::json::array({"the other nodes cannot be asked: etcd"}));
}

RankProgress progress(int rank, int64_t completed, int64_t open_since_us) {
  RankProgress p;
  p.global_rank = rank;
  p.completed = completed;
  p.open_op = open_since_us ? "gloo:all_reduce" : "";
  p.open_seq = open_since_us ? completed + 1 : 0;
  p.open_since_us = open_since_us;
  return p;
}

TEST(HangWatchdog, FiresWhenOneRankNeverJoinsTheOthersCollective) {
  using namespace std::chrono;
  HangWatchdog w(seconds(15));
  const auto t0 = HangWatchdog::Clock::now();
  const int64_t u0 = 1'000'000'000'000;
  std::vector<RankProgress> records = {progress(0, 1, u0), progress(1, 1, 0), progress(2, 1, u0)};
  EXPECT_FALSE(w.observe({0, 1, 2}, records, t0, u0));
  EXPECT_FALSE(w.observe({0, 1, 2}, records, t0 + seconds(14), u0 + 14'000'000));
  auto verdict = w.observe({0, 1, 2}, records, t0 + seconds(16), u0 + 16'000'000);
  ASSERT_TRUE(verdict);
  EXPECT_EQ(*verdict,
            "no collective completed for 16.0 s (--hang-timeout 15): ranks 0,2 wait in "
            "gloo:all_reduce #2 since 16.0 s; rank 1 is in no collective (1 completed)");
  EXPECT_EQ(w.idle(), std::vector<int>({1}));
}

TEST(HangWatchdog, ProgressAndLongPhasesWithoutCollectivesAreNoHang) {
  using namespace std::chrono;
  HangWatchdog w(seconds(15));
  const auto t0 = HangWatchdog::Clock::now();
  const int64_t u0 = 1'000'000'000'000;
  // An hour of compute with no collective open: no hang.
  std::vector<RankProgress> idle = {progress(0, 5, 0), progress(1, 5, 0)};
  EXPECT_FALSE(w.observe({0, 1}, idle, t0, u0));
  EXPECT_FALSE(w.observe({0, 1}, idle, t0 + hours(1), u0 + 3'600'000'000));
  // Collectives keep completing: no hang, however long one of them took.
  HangWatchdog busy(seconds(15));
  for (int i = 0; i < 10; ++i) {
    std::vector<RankProgress> r = {progress(0, i, u0), progress(1, i, u0)};
    EXPECT_FALSE(busy.observe({0, 1}, r, t0 + seconds(10 * i), u0 + 10'000'000LL * i)) << i;
  }
}

TEST(TorchProgress, ParsesTheHooksRecord) {
  auto p = parse_progress(
      R"({"rank": 2, "pid": 9, "completed": 4, "enqueued": 5, "open_op": "gloo:all_reduce",
          "open_seq": 5, "open_since_us": 123})");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->global_rank, 2);
  EXPECT_EQ(p->open_seq, 5);
  EXPECT_FALSE(parse_progress("{\"pid\": 1}"));
  EXPECT_FALSE(parse_progress("not json"));
}

// A Python worker on the ddp backend has both records (the hook's and ddp's recorder's):
// counts add, the older open operation wins.
TEST(TorchProgress, RecordsOfBothRecordersMerge) {
  auto torch = parse_progress(R"({"rank": 1, "completed": 4, "enqueued": 5,
      "open_op": "gloo:barrier", "open_seq": 5, "open_since_us": 200})");
  auto ddp = parse_progress(R"({"rank": 1, "completed": 10, "enqueued": 11,
      "open_op": "cpu:all_reduce", "open_seq": 11, "open_since_us": 100})");
  ASSERT_TRUE(torch && ddp);
  RankProgress m = merge_progress(*torch, *ddp);
  EXPECT_EQ(m.completed, 14);
  EXPECT_EQ(m.enqueued, 16);
  EXPECT_EQ(m.open_op, "cpu:all_reduce");
  EXPECT_EQ(m.open_since_us, 100);
  torch->open_since_us = 0;
  EXPECT_EQ(merge_progress(*ddp, *torch).open_op, "cpu:all_reduce");
}

TEST(TorchFlightDump, BecomesTheHangReportsRecord) {
  const std::string text = R"({"format": "torch-flight-recorder", "rank": 1, "pid": 5,
    "host": "h", "dumped_at_us": 2000000, "trace": {
      "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}},
      "pg_status": {"0": {"last_completed_collective": "1", "last_enqueued_collective": "2"}},
      "entries": [
        {"collective_seq_id": 1, "pg_id": 0, "process_group": ["0", "default_pg"],
         "profiling_name": "gloo:all_reduce", "input_dtypes": ["Float"], "input_sizes": [[4, 2]],
         "time_created_ns": 1000000000, "is_p2p": false},
        {"collective_seq_id": 2, "pg_id": 0, "process_group": ["0", "default_pg"],
         "profiling_name": "gloo:broadcast", "input_dtypes": ["Long"], "input_sizes": [[3]],
         "time_created_ns": 1500000000, "is_p2p": false}]}})";
  const auto dumps = parse_torch_flight_dump(text, "f.json");
  ASSERT_EQ(dumps.size(), 1u);
  const FlightDump& d = dumps[0];
  EXPECT_EQ(d.group, "torch:default_pg");
  EXPECT_EQ(d.backend, "gloo");
  EXPECT_EQ(d.global_rank, 1);
  EXPECT_EQ(d.group_size, 3);
  ASSERT_EQ(d.entries.size(), 2u);
  EXPECT_EQ(d.entries[0].op, "all_reduce");
  EXPECT_EQ(d.entries[0].dtype, "float32");
  EXPECT_EQ(d.entries[0].count, 8u);
  EXPECT_EQ(d.entries[0].state, "completed");
  EXPECT_EQ(d.entries[1].state, "started");
  EXPECT_THROW(parse_torch_flight_dump("{\"format\": \"x\"}", "g.json"), UsageError);
}

}  // namespace
}  // namespace ddp::launcher
