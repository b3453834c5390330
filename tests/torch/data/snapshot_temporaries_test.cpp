// Snapshot temporaries: created safely (never through a planted symlink) and cleaned up
// precisely (only this series' own, only a dead writer's).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "ddp/torch/snapshot/snapshot.hpp"
#include "ddp/torch/snapshot/snapshot_file.hpp"

namespace {

class SnapshotTemporariesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddp_snaptmp_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  static ddp::Snapshot make(int64_t epochs) {
    torch::nn::Linear lin(4, 1);
    return ddp::capture_snapshot(*lin, nullptr, epochs, epochs);
  }
  static void write_text(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static bool exists(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0;
  }
  // A pid that belonged to a process which has exited and been reaped.
  static pid_t dead_pid() {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    int status = 0;
    ::waitpid(child, &status, 0);
    return child;
  }
  std::string dir_;
};

// Rank 0 must never write through a symlink planted at a temporary's name: the old code
// opened `.NAME.tmp-<pid>` with O_CREAT|O_TRUNC (following links), and its cleanup skipped
// exactly that name, so the link's target was truncated and overwritten.
TEST_F(SnapshotTemporariesTest, PlantedSymlinkAtTemporaryNameIsNeverFollowed) {
  const std::string victim = dir_ + "/victim.txt";
  write_text(victim, "precious");
  ddp::SnapshotManager mgr(ddp::SnapshotOptions(dir_ + "/snap.pt"));
  const std::string pid = std::to_string(::getpid());
  for (const std::string& base : {std::string("snap.epoch-000001.pt"), std::string("snap.pt")}) {
    ASSERT_EQ(::symlink(victim.c_str(), (dir_ + "/." + base + ".tmp-" + pid).c_str()), 0);
  }
  ASSERT_EQ(::symlink(victim.c_str(), (dir_ + "/.snap.pt.link-" + pid).c_str()), 0);
  mgr.save(make(1));
  EXPECT_TRUE(read_text(victim) == "precious") << "the planted symlink's target was overwritten";
  EXPECT_EQ(ddp::verify_zip_checksum(ddp::read_whole_file(mgr.epoch_file(1))),
            ddp::ChecksumStatus::kValid);
  struct stat st {};
  ASSERT_EQ(::lstat((dir_ + "/snap.pt").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

// Same for the atomic writer used directly.
TEST_F(SnapshotTemporariesTest, AtomicWriteNeverFollowsAPlantedSymlink) {
  const std::string victim = dir_ + "/victim.txt";
  write_text(victim, "precious");
  const std::string target = dir_ + "/file.bin";
  ASSERT_EQ(
      ::symlink(victim.c_str(), (dir_ + "/.file.bin.tmp-" + std::to_string(::getpid())).c_str()),
      0);
  ddp::write_file_atomically(target, {'a', 'b', 'c'});
  EXPECT_TRUE(read_text(victim) == "precious") << "the planted symlink's target was overwritten";
  EXPECT_EQ(read_text(target), "abc");
}

// Temporary names are unpredictable (pid plus a random part), so two writes never share one.
TEST_F(SnapshotTemporariesTest, TemporaryNamesAreUniqueAndParsable) {
  const std::string a = ddp::temporary_path(dir_ + "/x.pt", "tmp");
  const std::string b = ddp::temporary_path(dir_ + "/x.pt", "tmp");
  EXPECT_NE(a, b);
  const std::string name = a.substr(a.rfind('/') + 1);
  auto parsed = ddp::parse_temporary_name(name);
  ASSERT_TRUE(parsed.has_value()) << name;
  EXPECT_EQ(parsed->target_base, "x.pt");
  EXPECT_EQ(parsed->kind, "tmp");
  EXPECT_EQ(parsed->pid, ::getpid());
  EXPECT_FALSE(ddp::parse_temporary_name("x.pt").has_value());
  EXPECT_FALSE(ddp::parse_temporary_name(".x.pt.tmp-").has_value());
  EXPECT_FALSE(ddp::parse_temporary_name(".x.pt.tmp-12z").has_value());
  auto legacy = ddp::parse_temporary_name(".x.pt.tmp-42");
  ASSERT_TRUE(legacy.has_value());
  EXPECT_EQ(legacy->pid, 42);
}

// Cleanup before a save removes only this series' temporaries whose writer is gone: another
// series sharing the prefix (`model` vs `model_best`) keeps its in-flight files, and a live
// writer (pid 1 is always alive) keeps its own.
TEST_F(SnapshotTemporariesTest, CleanupRemovesOnlyThisSeriesDeadWritersTemporaries) {
  const std::string dead = std::to_string(dead_pid());
  const std::string live = "1";
  const std::vector<std::string> removed = {
      ".model.epoch-000003.pt.tmp-" + dead + "-0123456789abcdef",
      ".model.pt.tmp-" + dead + "-00000000deadbeef", ".model.pt.link-" + dead + "-0000000000000001",
      ".model.epoch-000002.pt.tmp-" + dead,  // the old naming, from an older build
  };
  const std::vector<std::string> kept = {
      ".model_best.epoch-000003.pt.tmp-" + dead + "-0123456789abcdef",  // another series
      ".model_best.pt.tmp-" + dead,
      ".model_best.pt.link-" + dead + "-0000000000000001",
      ".model.epoch-000003.pt.tmp-" + live + "-0123456789abcdef",  // a live writer
      ".model.pt.link-" + live + "-0000000000000002",
      ".model.epoch-x.pt.tmp-" + dead,  // not a name this series writes
      ".model.ptx.tmp-" + dead,
      ".modelling.pt.tmp-" + dead,
  };
  for (const auto& n : removed) write_text(dir_ + "/" + n, "partial");
  for (const auto& n : kept) write_text(dir_ + "/" + n, "partial");
  ddp::SnapshotManager(ddp::SnapshotOptions(dir_ + "/model.pt")).save(make(4));
  for (const auto& n : removed) EXPECT_FALSE(exists(dir_ + "/" + n)) << n << " should be removed";
  for (const auto& n : kept) EXPECT_TRUE(exists(dir_ + "/" + n)) << n << " should be kept";
}

}  // namespace
