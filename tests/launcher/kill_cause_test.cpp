// Kills explained, from fixture text: the cgroup files (v1 and v2), /proc/<pid>/cgroup and
// mountinfo, kernel log records, /proc/<pid>/stat lines; and the messages built from them
// (an out-of-memory kill, a SIGKILL from outside, a child's OOM kill, a D-state worker). The
// real out-of-memory kill is ddprun_oom_test.cpp.
//
// A real process in uninterruptible sleep cannot be made on demand in a test (it takes a hung
// NFS mount, a stuck device or a kernel module), so the D state is tested from a stat line.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/launcher/hang_report.hpp"
#include "ddp/launcher/kernel_log.hpp"
#include "ddp/launcher/kill_cause.hpp"
#include "ddp/launcher/memory_cgroup.hpp"
#include "ddp/launcher/root_cause.hpp"

using namespace ddp::launcher;

namespace {

constexpr const char* kHybridMountinfo =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

constexpr const char* kHybridCgroup =
    "9:name=systemd:/\n"
    "4:memory:/slurm/uid_0/job_7/step_0\n"
    "1:cpu:/\n"
    "0::/\n";

KillEvidence oom_in_cgroup() {
  KillEvidence e;
  e.peak_rss_kib = 812 * 1024;
  e.cgroup = "/sys/fs/cgroup/memory/x";
  e.oom_kills_before = 0;
  e.oom_kills_now = 1;
  e.limit_read = true;
  e.limit_cgroup = "/sys/fs/cgroup/memory/x";
  e.limit_bytes = uint64_t{256} << 20;
  e.limit_peak_bytes = uint64_t{256} << 20;
  return e;
}

const ExitStatus kSigkill{true, SIGKILL};

// A worker that died by SIGKILL, explained by `kill`.
WorkerFailure sigkilled(int global_rank, int local_rank, int pid, const KillExplanation& kill) {
  WorkerFailure f;
  f.global_rank = global_rank;
  f.local_rank = local_rank;
  f.pid = pid;
  f.status = kSigkill;
  f.kill = kill;
  return f;
}

}  // namespace

TEST(MemoryCgroup, OomKillCountFromV2EventsAndV1OomControl) {
  EXPECT_EQ(parse_oom_kill_count("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"),
            2u);
  EXPECT_EQ(parse_oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"), 5u);
  EXPECT_EQ(parse_oom_kill_count("oom_kill_disable 0\nunder_oom 0\n"), std::nullopt);
  EXPECT_EQ(parse_oom_kill_count(""), std::nullopt);
}

TEST(MemoryCgroup, LimitsAndCounts) {
  EXPECT_EQ(parse_memory_limit("max\n").read, true);
  EXPECT_EQ(parse_memory_limit("max\n").bytes, std::nullopt);
  EXPECT_EQ(parse_memory_limit("268435456\n").bytes, uint64_t{256} << 20);
  // v1's "no limit" is the page counter's maximum.
  EXPECT_EQ(parse_memory_limit("9223372036854771712\n").read, true);
  EXPECT_EQ(parse_memory_limit("9223372036854771712\n").bytes, std::nullopt);
  EXPECT_FALSE(parse_memory_limit("").read);
  EXPECT_FALSE(parse_memory_limit("lots").read);
  EXPECT_EQ(parse_byte_count("1048576\n"), 1048576u);
  EXPECT_EQ(parse_byte_count("-1"), std::nullopt);
  EXPECT_EQ(parse_byte_count(""), std::nullopt);
}

TEST(MemoryCgroup, ResolvesV1OnAHybridMachine) {
  const auto c = resolve_memory_cgroup(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->version, 1);
  EXPECT_EQ(c->dir, "/sys/fs/cgroup/memory/slurm/uid_0/job_7/step_0");
  EXPECT_EQ(c->root, "/sys/fs/cgroup/memory");
}

TEST(MemoryCgroup, ResolvesV2AndAContainersOwnRoot) {
  const std::string v2_mounts = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
  const auto c = resolve_memory_cgroup("0::/user.slice/job.scope\n", v2_mounts);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->version, 2);
  EXPECT_EQ(c->dir, "/sys/fs/cgroup/user.slice/job.scope");
  // A container mounts its own cgroup as the root of what it sees.
  const std::string container = "25 1 0:22 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(resolve_memory_cgroup("0::/docker/abc\n", container)->dir, "/sys/fs/cgroup");
  EXPECT_EQ(resolve_memory_cgroup("0::/docker/abc/w\n", container)->dir, "/sys/fs/cgroup/w");
  EXPECT_FALSE(resolve_memory_cgroup("0::/x\n", "").has_value());
  EXPECT_FALSE(resolve_memory_cgroup("", kHybridMountinfo).has_value());
}

TEST(MemoryCgroup, ThisProcessIsFoundWhereTheMachineHasAMemoryController) {
  // Not every machine (or container) has one; when it does, its counter file must parse.
  const auto c = memory_cgroup_of(::getpid());
  if (!c) GTEST_SKIP() << "no memory cgroup mounted for this process";
  EXPECT_TRUE(read_oom_kill_count(*c).has_value()) << c->dir;
  EXPECT_TRUE(read_memory_limit(*c).read) << c->dir;
}

TEST(KernelLog, ParsesOutOfMemoryRecords) {
  const auto cgroup_oom = parse_oom_kill_record(
      "3,4521,93485123,-;Memory cgroup out of memory: Killed process 604 (launcher_test_w) "
      "total-vm:70000kB, anon-rss:60000kB, file-rss:1000kB, shmem-rss:0kB, UID:0 pgtables:200kB "
      "oom_score_adj:0\n SUBSYSTEM=memory\n");
  ASSERT_TRUE(cgroup_oom.has_value());
  EXPECT_EQ(cgroup_oom->pid, 604);
  EXPECT_EQ(cgroup_oom->text, "Memory cgroup out of memory: Killed process 604 (launcher_test_w)");

  const auto global = parse_oom_kill_record(
      "[ 1234.5678] Out of memory: Killed process 99 (python3) total-vm:1kB, anon-rss:1kB");
  ASSERT_TRUE(global.has_value());
  EXPECT_EQ(global->pid, 99);
  EXPECT_EQ(global->text, "Out of memory: Killed process 99 (python3)");

  const auto info = parse_oom_kill_record(
      "6,4520,93485000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
      "mems_allowed=0,oom_memcg=/x,task_memcg=/x,task=python3,pid=1234,uid=0");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pid, 1234);
  EXPECT_EQ(info->text, "oom-kill: task=python3,pid=1234");

  EXPECT_FALSE(parse_oom_kill_record("6,1,1,-;eth0: link up").has_value());
  EXPECT_FALSE(
      parse_oom_kill_record("4,2,2,-;python3 invoked oom-killer: gfp_mask=0xcc0").has_value());
  EXPECT_FALSE(parse_oom_kill_record("").has_value());
}

TEST(KernelLog, AnUnreadableLogIsNotUsed) {
  KernelLog log = KernelLog::open_at_end("/nonexistent/kmsg");
  EXPECT_FALSE(log.readable());
  EXPECT_TRUE(log.read_oom_kills().empty());
  EXPECT_FALSE(log.wait_for_record(1));
}

TEST(KillCause, OutOfMemoryKillNamesMemoryAndLimit) {
  KillEvidence e = oom_in_cgroup();
  e.kernel_log_read = true;
  e.kernel_log_record = "Memory cgroup out of memory: Killed process 1234 (python3)";
  const KillExplanation k = explain_exit(kSigkill, false, e);
  EXPECT_EQ(k.cause, KillCause::kOutOfMemory);
  EXPECT_TRUE(k.consumed_oom_kill);
  EXPECT_EQ(k.text,
            "was killed by the kernel's out-of-memory killer (SIGKILL): its peak resident memory "
            "was 812 MiB; cgroup /sys/fs/cgroup/memory/x limit 256 MiB, peak 256 MiB. Give it "
            "more memory (the cgroup's memory limit / the job's --mem) or use less per rank. "
            "(evidence: kernel log 'Memory cgroup out of memory: Killed process 1234 (python3)'; "
            "cgroup oom_kill count 0 -> 1)");

  const WorkerFailure f = sigkilled(1, 1, 1234, k);
  EXPECT_EQ(describe_failure(f).rfind("rank 1 (local rank 1, pid 1234) was killed by the kernel's "
                                      "out-of-memory killer (SIGKILL): its peak resident memory "
                                      "was 812 MiB; cgroup /sys/fs/cgroup/memory/x limit 256 MiB",
                                      0),
            0u)
      << describe_failure(f);
  FailureReport r;
  r.root_cause = f;
  const std::string report = format_failure_report(r);
  EXPECT_NE(report.find("  exit:       signal 9 (SIGKILL)\n  cause:      killed by the kernel's "
                        "out-of-memory killer (SIGKILL): its peak"),
            std::string::npos)
      << report;
}

TEST(KillCause, CounterAloneIsEvidenceWhenTheLogIsUnreadable) {
  const KillExplanation k = explain_exit(kSigkill, false, oom_in_cgroup());
  EXPECT_EQ(k.cause, KillCause::kOutOfMemory);
  EXPECT_NE(k.text.find("(evidence: cgroup oom_kill count 0 -> 1)"), std::string::npos) << k.text;
  // Also when ddprun was stopping the group: the counter rose, not ddprun's own kill.
  EXPECT_EQ(explain_exit(kSigkill, true, oom_in_cgroup()).cause, KillCause::kOutOfMemory);
}

TEST(KillCause, KernelLogAloneIsEvidenceWithoutACgroup) {
  KillEvidence e;
  e.peak_rss_kib = 3 * 1024 * 1024;
  e.kernel_log_read = true;
  e.kernel_log_record = "Out of memory: Killed process 7 (train)";
  const KillExplanation k = explain_exit(kSigkill, false, e);
  EXPECT_EQ(k.cause, KillCause::kOutOfMemory);
  EXPECT_FALSE(k.consumed_oom_kill);
  EXPECT_NE(k.text.find("its peak resident memory was 3.0 GiB; its memory cgroup is unknown."),
            std::string::npos)
      << k.text;
}

TEST(KillCause, NoLimitMeansTheMachineRanOut) {
  KillEvidence e = oom_in_cgroup();
  e.limit_bytes.reset();
  e.limit_cgroup.clear();
  const KillExplanation k = explain_exit(kSigkill, false, e);
  EXPECT_NE(k.text.find("no memory limit applies to cgroup /sys/fs/cgroup/memory/x or its "
                        "ancestors, so the machine as a whole ran out of memory"),
            std::string::npos)
      << k.text;
}

TEST(KillCause, SigkillWithoutEvidenceIsFromOutside) {
  KillEvidence e = oom_in_cgroup();
  e.oom_kills_now = 0;  // the counter did not move
  e.peak_rss_kib = 12 * 1024;
  e.kernel_log_read = true;
  const KillExplanation k = explain_exit(kSigkill, false, e);
  EXPECT_EQ(k.cause, KillCause::kSigkillFromOutside);
  EXPECT_FALSE(k.consumed_oom_kill);
  EXPECT_EQ(k.text,
            "killed by SIGKILL from outside (not the OOM killer: the cgroup's oom_kill count did "
            "not change); its peak resident memory was 12 MiB");
  const WorkerFailure f = sigkilled(2, 0, 42, k);
  EXPECT_EQ(describe_failure(f),
            "rank 2 (local rank 0, pid 42) failed: signal 9 (SIGKILL); killed by SIGKILL from "
            "outside (not the OOM killer: the cgroup's oom_kill count did not change); its peak "
            "resident memory was 12 MiB");
  // ddprun's own SIGKILL (the group was being stopped) needs no explanation.
  EXPECT_EQ(explain_exit(kSigkill, true, e).cause, KillCause::kNone);
}

TEST(KillCause, ARiseThatTheLogPinsOnAnotherProcessIsNotThisWorkers) {
  KillEvidence e = oom_in_cgroup();
  e.kernel_log_read = true;
  e.other_victims = {555};
  const KillExplanation k = explain_exit(kSigkill, false, e);
  EXPECT_EQ(k.cause, KillCause::kSigkillFromOutside);
  EXPECT_NE(k.text.find("not the OOM killer: the kernel log names pid 555 as its victim, not this "
                        "worker"),
            std::string::npos)
      << k.text;
}

TEST(KillCause, WithNoEvidenceAtAllTheOomKillerIsNotRuledOut) {
  KillEvidence e;
  e.peak_rss_kib = 1024;
  const KillExplanation k = explain_exit(kSigkill, false, e);
  EXPECT_EQ(k.cause, KillCause::kSigkillFromOutside);
  EXPECT_EQ(k.text,
            "killed by SIGKILL from outside ddprun (the OOM killer cannot be ruled out: neither a "
            "cgroup oom_kill count nor the kernel log could be read); its peak resident memory "
            "was 1.0 MiB");
  e.kernel_log_read = true;
  EXPECT_NE(explain_exit(kSigkill, false, e)
                .text.find("not the OOM killer: the kernel log records no out-of-memory kill"),
            std::string::npos);
}

TEST(KillCause, AChildsOomKillIsNotedOnOtherFailures) {
  KillEvidence e = oom_in_cgroup();
  e.kernel_log_read = true;
  e.other_victims = {4321};
  const KillExplanation k = explain_exit(ExitStatus{false, 1}, false, e);
  EXPECT_EQ(k.cause, KillCause::kChildOutOfMemory);
  EXPECT_TRUE(k.consumed_oom_kill);
  EXPECT_EQ(k.text,
            "the kernel's out-of-memory killer killed a process in its cgroup while it ran "
            "(cgroup oom_kill count 0 -> 1: the kernel log names pid 4321; a child of it, such as "
            "a data loader worker?); its peak resident memory was 812 MiB");
  // Nothing to add to a plain failure, a crash, a success, or a worker ddprun stopped.
  KillEvidence quiet = oom_in_cgroup();
  quiet.oom_kills_now = 0;
  EXPECT_EQ(explain_exit(ExitStatus{false, 1}, false, quiet).cause, KillCause::kNone);
  EXPECT_EQ(explain_exit(ExitStatus{true, SIGSEGV}, false, quiet).cause, KillCause::kNone);
  EXPECT_EQ(explain_exit(ExitStatus{false, 0}, false, e).cause, KillCause::kNone);
  EXPECT_EQ(explain_exit(ExitStatus{true, SIGTERM}, true, e).cause, KillCause::kNone);
}

TEST(KillCause, FormatsBytes) {
  EXPECT_EQ(format_bytes(uint64_t{812} << 20), "812 MiB");
  EXPECT_EQ(format_bytes(uint64_t{7} << 19), "3.5 MiB");
  EXPECT_EQ(format_bytes(uint64_t{3} << 29), "1.5 GiB");
}

TEST(KillCause, UninterruptibleSleepFromAStatLine) {
  const std::string d_line =
      "99 (python3 (data)) D 1 99 99 0 -1 4194560 1200 0 0 0 10 5 0 0 20 0 1 0 100 1000000 200";
  EXPECT_EQ(stat_state(d_line), 'D');
  EXPECT_EQ(process_state_from_stat(d_line), RankProcess::State::kUninterruptible);
  EXPECT_EQ(process_state_from_stat("12 (sleep) S 1 12"), RankProcess::State::kRunning);
  EXPECT_EQ(process_state_from_stat("12 (sleep) T 1 12"), RankProcess::State::kStopped);
  EXPECT_EQ(process_state_from_stat("12 (sleep) Z 1 12"), RankProcess::State::kExited);
  EXPECT_EQ(process_state_from_stat(""), RankProcess::State::kExited);
  EXPECT_EQ(describe_uninterruptible(2, 99, "nfs_wait_bit_killable"),
            "rank 2 (pid 99) is in uninterruptible sleep (D state, in nfs_wait_bit_killable): it "
            "may not be killable, even by SIGKILL, until the kernel call returns (often a hung "
            "NFS or device)");
  EXPECT_EQ(describe_uninterruptible(2, 99, ""),
            "rank 2 (pid 99) is in uninterruptible sleep (D state): it may not be killable, even "
            "by SIGKILL, until the kernel call returns (often a hung NFS or device)");
  EXPECT_EQ(describe_uninterruptible(2, 99, "0"), describe_uninterruptible(2, 99, ""));
}

TEST(KillCause, HangReportNamesAWorkerInUninterruptibleSleep) {
  FlightDump a;
  a.rank = a.global_rank = 0;
  a.group_size = 2;
  a.pid = 100;
  a.host = "node";
  FlightEntry e;
  e.seq = 1;
  e.op = "all_reduce";
  e.dtype = "float32";
  e.count = 4;
  e.reduce_op = "sum";
  e.state = "started";
  e.queued_us = 1'700'000'000'000'000;
  e.started_us = e.queued_us + 10;
  a.entries.push_back(e);
  a.recorded = 1;
  a.dumped_at_us = e.queued_us + 3'000'000;
  RankProcess stuck;
  stuck.global_rank = 1;
  stuck.pid = 101;
  stuck.host = "node";
  stuck.state = RankProcess::State::kUninterruptible;
  stuck.wchan = "rpc_wait_bit_killable";
  const auto lines = analyze_hang({a}, {stuck});
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("hang report: rank 1 is frozen: its process (pid 101 on node) is in "
                           "uninterruptible sleep (D state, in rpc_wait_bit_killable): it may not "
                           "be killable, even by SIGKILL, until the kernel call returns (often a "
                           "hung NFS or device), so it could not write its record",
                           0),
            0u)
      << lines[0];
  // The state and wchan travel between nodes.
  const std::string pack = encode_node_records("", {stuck}, "node");
  const auto doc = nlohmann::json::parse(pack);
  EXPECT_EQ(doc["processes"][0]["state"], "uninterruptible");
  EXPECT_EQ(doc["processes"][0]["wchan"], "rpc_wait_bit_killable");
}
