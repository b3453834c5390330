// A --log-dir run folder is ddprun's own (issue 49, finding 1): created private, refused when
// it is a link, someone else's, or writable by others; the --hang-timeout hook folder, which
// leads every worker's PYTHONPATH, holds the hook alone.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ddp/launcher/run_directory.hpp"
#include "ddp/launcher/torch_progress.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {
namespace {

namespace fs = std::filesystem;

class RunFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    logs_ = fs::temp_directory_path() /
            ("ddp_run_folder_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(logs_);
    fs::create_directories(logs_);
  }
  void TearDown() override { fs::remove_all(logs_); }

  // The UsageError of a RunDirectory for run id `run`, or "<no error>".
  std::string refusal(const std::string& run) {
    try {
      RunDirectory dir(logs_.string(), run);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "<no error>";
  }

  fs::path logs_;
};

TEST_F(RunFolder, ANewOneIsCreatedPrivate) {
  RunDirectory dir(logs_.string(), "job1");
  struct stat st {};
  ASSERT_EQ(::stat(dir.root().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  // An existing one of this user that others cannot write into is taken again (a reused run id).
  EXPECT_EQ(refusal("job1"), "<no error>");
  fs::create_directory(logs_ / "mine");
  fs::permissions(logs_ / "mine", fs::perms(0755));
  EXPECT_EQ(refusal("mine"), "<no error>");
}

TEST_F(RunFolder, OneOthersCanWriteIntoIsRefusedWithTheFix) {
  fs::create_directory(logs_ / "none");
  fs::permissions(logs_ / "none", fs::perms(0777));
  const std::string why = refusal("none");
  EXPECT_NE(why.find("has mode 0777: other users can write into it"), std::string::npos) << why;
  EXPECT_NE(why.find("use a --log-dir of your own"), std::string::npos) << why;
}

TEST_F(RunFolder, ALinkIsRefused) {
  fs::create_directory(logs_ / "elsewhere");
  fs::create_directory_symlink(logs_ / "elsewhere", logs_ / "run");
  EXPECT_NE(refusal("run").find("is a symbolic link"), std::string::npos);
}

TEST_F(RunFolder, AnotherUsersIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the folder to another user";
  fs::create_directory(logs_ / "theirs");
  fs::permissions(logs_ / "theirs", fs::perms(0700));
  ASSERT_EQ(::chown((logs_ / "theirs").c_str(), 65534, 65534), 0);
  EXPECT_NE(refusal("theirs").find("belongs to uid 65534, not to you"), std::string::npos);
}

TEST_F(RunFolder, TheHookFolderHoldsTheHookAlone) {
  RunDirectory dir(logs_.string(), "job");
  // What an earlier run (or anyone, before the folder was checked) left beside the hook.
  fs::create_directories(dir.root() + "/python_hook");
  std::ofstream(dir.root() + "/python_hook/usercustomize.py") << "import os; os._exit(3)\n";
  fs::create_symlink("/etc/passwd", dir.root() + "/python_hook/sitecustomize.py");
  const std::string hook = write_python_hook(dir.root());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(hook)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"sitecustomize.py"});
  EXPECT_FALSE(fs::is_symlink(hook + "/sitecustomize.py"));
  struct stat st {};
  ASSERT_EQ(::stat(hook.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

}  // namespace
}  // namespace ddp::launcher
