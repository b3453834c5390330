#pragma once
// The fixture of the stack service's unit tests (stacks_test.cpp, stack_rounds_test.cpp): a
// folder of the test's own as DDPRUN_RUNTIME_DIR, where fake stack tools are written.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

namespace ddp::launcher::testing {

// A folder of the test's own, removed at the end; fake stack tools are written into it.
class StacksWithTools : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddp-stacks-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const char* old = std::getenv("DDPRUN_RUNTIME_DIR");
    if (old) old_runtime_dir_ = old;
    ::setenv("DDPRUN_RUNTIME_DIR", (dir_ + "/rt").c_str(), 1);
  }
  void TearDown() override {
    if (old_runtime_dir_) {
      ::setenv("DDPRUN_RUNTIME_DIR", old_runtime_dir_->c_str(), 1);
    } else {
      ::unsetenv("DDPRUN_RUNTIME_DIR");
    }
    (void)!::system(("rm -rf " + dir_).c_str());
  }
  std::string tool(const std::string& name, const std::string& script) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << script << "\n";
    ::chmod(path.c_str(), 0755);
    return path;
  }
  // A fake eu-stack that prints one frame, `wait_here`, for the pid it is given; `before`: shell
  // lines it runs first.
  std::string one_frame_eu_stack(const std::string& before = "") {
    return tool("eu-stack", before +
                                "echo \"PID $2 - process\"; echo \"TID $2:\"; "
                                "echo \"#0  0x00007f38b2aed545 wait_here\"");
  }
  std::string dir_;
  std::optional<std::string> old_runtime_dir_;
};

}  // namespace ddp::launcher::testing
