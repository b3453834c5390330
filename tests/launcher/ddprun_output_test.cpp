// ddprun end to end: console forwarding, tee prefixes, redirects, the local-ranks filter,
// the --log-dir layout, and an unmodified PyTorch script.
#include <gtest/gtest.h>

#include <cstdlib>

#include "launcher_fixture.hpp"

namespace ddp::launcher::testing {
namespace {

using DdprunOutput = LauncherTest;

TEST_F(DdprunOutput, PlainOutputIsForwardedUnprefixed) {
  RunResult r = run({"--nproc-per-node", "2", worker(), "print", "to-out", "eprint", "to-err"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_with(r.out, "to-out"), (std::vector<std::string>{"to-out", "to-out"}));
  EXPECT_EQ(lines_with(r.err, "to-err"), (std::vector<std::string>{"to-err", "to-err"}));
}

TEST_F(DdprunOutput, TeePrefixesLinesWithRoleAndRank) {
  RunResult r = run({"--nproc-per-node", "2", "--role", "trainer", "-t", "3", worker(), "print",
                     "hello", "eprint", "oops"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_with(r.out, "hello").size(), 2u) << r.out;
  EXPECT_NE(r.out.find("[trainer0]:hello\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[trainer1]:hello\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[trainer0]:oops\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[trainer1]:oops\n"), std::string::npos) << r.err;

  // Per-rank map: only rank 1's stdout is tee'd (prefixed); rank 0 prints plain.
  r = run({"--nproc-per-node", "2", "--tee", "1:1", worker(), "print", "hello"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[default1]:hello\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[default0]"), std::string::npos) << r.out;
  EXPECT_EQ(lines_with(r.out, "hello").size(), 2u) << r.out;
}

TEST_F(DdprunOutput, RedirectsKeepStreamsOffTheConsole) {
  std::string logs = dir() + "/logs";
  RunResult r = run({"--nproc-per-node", "2", "-r", "0:1", "--log-dir", logs, "--run-id", "red",
                     worker(), "print", "hello", "eprint", "oops"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_with(r.out, "hello"), (std::vector<std::string>{"hello"})) << r.out;
  EXPECT_EQ(lines_with(r.err, "oops").size(), 2u) << r.err;
  EXPECT_EQ(read_file(logs + "/red/attempt_0/0/stdout.log"), "hello\n");
  EXPECT_EQ(read_file(logs + "/red/attempt_0/1/stdout.log"), "hello\n");
}

TEST_F(DdprunOutput, LocalRanksFilterLimitsTheConsole) {
  RunResult r = run({"--nproc-per-node", "3", "-t", "3", "--local-ranks-filter", "0,2", worker(),
                     "print", "hello", "eprint", "oops"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Workers run concurrently, so their lines arrive in any order: compare sorted.
  EXPECT_EQ(sorted(lines_with(r.out, "hello")),
            (std::vector<std::string>{"[default0]:hello", "[default2]:hello"}))
      << r.out;
  EXPECT_EQ(sorted(lines_with(r.err, "oops")),
            (std::vector<std::string>{"[default0]:oops", "[default2]:oops"}))
      << r.err;
}

TEST_F(DdprunOutput, LogDirHoldsEveryRankAndAttempt) {
  std::string logs = dir() + "/logs";
  RunResult r = run({"--nproc-per-node",
                     "2",
                     "--max-restarts",
                     "1",
                     "--log-dir",
                     logs,
                     "--run-id",
                     "r1",
                     worker(),
                     "print",
                     "hello",
                     "eprint",
                     "oops",
                     "error-file-if-rank",
                     "1",
                     "RuntimeError: first try",
                     "fail-if-rank",
                     "1",
                     "5",
                     "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      std::string d = logs + "/r1/attempt_" + std::to_string(attempt) + "/" + std::to_string(rank);
      EXPECT_TRUE(file_exists(d + "/stdout.log")) << d;
      EXPECT_TRUE(file_exists(d + "/stderr.log")) << d;
      // Rank 0 of attempt 0 may be stopped before it writes (rank 1 fails at once).
      if (attempt == 0 && rank == 0) continue;
      EXPECT_EQ(read_file(d + "/stdout.log"), "hello\n") << d;
      EXPECT_EQ(read_file(d + "/stderr.log"), "oops\n") << d;
    }
  }
  std::string error = read_file(logs + "/r1/attempt_0/1/error.json");
  EXPECT_NE(error.find("RuntimeError: first try"), std::string::npos) << error;
  // The restarted rank 1 wrote it again; rank 0 never did.
  EXPECT_TRUE(file_exists(logs + "/r1/attempt_1/1/error.json"));
  EXPECT_FALSE(file_exists(logs + "/r1/attempt_0/0/error.json"));
  EXPECT_FALSE(file_exists(logs + "/r1/attempt_2"));
}

TEST_F(DdprunOutput, TemporaryLogDirIsRemoved) {
  RunResult r = run({"--nproc-per-node", "1", worker(), "env"}, {{"TMPDIR", dir()}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto line = lines_with(r.out, "TORCHELASTIC_ERROR_FILE=");
  ASSERT_EQ(line.size(), 1u);
  EXPECT_NE(line[0].find("TORCHELASTIC_ERROR_FILE=" + dir() + "/ddprun-"), std::string::npos)
      << line[0];
  std::string path = line[0].substr(line[0].find("TORCHELASTIC_ERROR_FILE=") + 24);
  path = path.substr(0, path.find(' '));
  std::string tmp_root = path.substr(0, path.find("/attempt_0"));
  EXPECT_FALSE(file_exists(tmp_root)) << tmp_root;
}

TEST_F(DdprunOutput, PartialLastLineIsForwarded) {
  RunResult r = run({"-t", "1", "/bin/sh", "-c", "printf 'no newline'"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[default0]:no newline\n");
}

// As a user in the activated virtual environment runs it: ddprun takes that python3 from PATH.
TEST_F(DdprunOutput, UnmodifiedPytorchScriptRunsWithGloo) {
  const std::string python = DDP_TEST_PYTHON;
  if (python.empty() ||
      ::system((python + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "'" << python << "' cannot import torch (run scripts/install-deps.sh)";
  }
  const char* path = std::getenv("PATH");
  const std::string venv_path =
      python.substr(0, python.rfind('/')) + ":" + (path ? path : "/usr/bin:/bin");
  RunResult r = run({"--standalone", "--nproc-per-node", "2",
                     std::string(DDP_LAUNCHER_WORKERS_DIR) + "/torch_allreduce.py"},
                    {{"PATH", venv_path}}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 0/2: all_reduce ok 3.0"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 1/2: all_reduce ok 3.0"), std::string::npos) << r.out << r.err;
}

}  // namespace
}  // namespace ddp::launcher::testing
