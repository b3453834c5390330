// `ddprun stacks` trusts nothing another local user could have placed (issue 49, finding 2):
// records that are links, FIFOs or another user's files are passed over, a registry folder
// others can write is refused, a socket served by another user or process is refused, an
// answer is bounded, and what it prints from the workers cannot drive the terminal.
//
// DDPRUN_RUNTIME_DIR points at a private folder of the test; a "fake agent" is a thread of the
// test serving one answer on a Unix socket, with a record naming this process (it is alive and
// this user's, as an agent would be).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "ddp/launcher/process.hpp"
#include "ddp/launcher/stacks.hpp"
#include "ddp/launcher/stacks_command.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {
namespace {

class StacksCommandTrust : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddp_stacks_trust_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;  // mode 700
    ::setenv("DDPRUN_RUNTIME_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("DDPRUN_RUNTIME_DIR");
    std::system(("rm -rf " + dir_).c_str());
  }

  // A record of run "job" naming `pid` and `socket`, written as an agent writes it.
  void write_record(const std::string& path, int64_t pid, const std::string& socket) {
    std::ofstream(path) << nlohmann::json{
        {"format", "ddprun-agent"},
        {"run_id", "job"},
        {"host", ""},
        {"pid", pid},
        {"socket", socket}}.dump();
  }

  // Listens on `socket`; the thread answers the first request with `answer` and closes.
  std::thread serve_once(const std::string& socket, std::string answer) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd.get(), 1), 0);
    return std::thread([listen_fd = std::move(fd), answer = std::move(answer)]() mutable {
      UniqueFd conn(::accept(listen_fd.get(), nullptr, nullptr));
      if (!conn.valid()) return;
      char buf[4096];
      (void)::read(conn.get(), buf, sizeof(buf));  // the request line
      for (size_t sent = 0; sent < answer.size();) {
        const ssize_t n =
            ::send(conn.get(), answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) return;  // the client stopped reading (the size cap)
        sent += static_cast<size_t>(n);
      }
    });
  }

  StacksCommand command() const {
    StacksCommand c;
    c.run_id = "job";
    c.timeout_s = 5;
    return c;
  }

  std::string dir_;
};

TEST_F(StacksCommandTrust, RecordsThatAreLinksFifosOrOthersFilesArePassedOverWithTheReason) {
  // A real-looking record elsewhere, reached through a link; a FIFO (reading it would block).
  const std::string elsewhere = dir_ + "/elsewhere";
  write_record(elsewhere, ::getpid(), dir_ + "/nothing.sock");
  ASSERT_EQ(::symlink(elsewhere.c_str(), (dir_ + "/job.1.json").c_str()), 0);
  ASSERT_EQ(::mkfifo((dir_ + "/job.2.json").c_str(), 0600), 0);
  if (::geteuid() == 0) {  // only root can give a file away
    write_record(dir_ + "/job.3.json", ::getpid(), dir_ + "/nothing.sock");
    ASSERT_EQ(::chown((dir_ + "/job.3.json").c_str(), 65534, 65534), 0);
  }
  ::testing::internal::CaptureStderr();
  const int code = run_stacks_command(command());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 2) << err;  // no agent: nothing trusted was found
  EXPECT_NE(err.find("ignored " + dir_ + "/job.1.json: a symbolic link"), std::string::npos) << err;
  EXPECT_NE(err.find("ignored " + dir_ + "/job.2.json: not a regular file"), std::string::npos)
      << err;
  if (::geteuid() == 0) {
    EXPECT_NE(err.find("ignored " + dir_ + "/job.3.json: owned by uid 65534, not by this user"),
              std::string::npos)
        << err;
  }
}

TEST_F(StacksCommandTrust, ARegistryFolderOthersCanWriteIsRefused) {
  write_record(dir_ + "/job.1.json", ::getpid(), dir_ + "/nothing.sock");
  ::chmod(dir_.c_str(), 0777);
  try {
    run_stacks_command(command());
    ADD_FAILURE() << "a world-writable registry folder was trusted";
  } catch (const UsageError& e) {
    EXPECT_NE(
        std::string(e.what()).find(dir_ + " is not a private folder of this user (owner uid " +
                                   std::to_string(::geteuid()) + ", mode 777)"),
        std::string::npos)
        << e.what();
  }
}

TEST_F(StacksCommandTrust, ARecordOfAPidThatIsNotThisUsersIsNoAgent) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the command as another user";
  // The command as uid 65534, with a record of its own naming this (root's) process: kill(pid,
  // 0) answers EPERM, which is "alive but not ours", so no agent (exit 2). Counted as alive,
  // the command tried the record's socket and failed (exit 3 here).
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    char tmpl[] = "/tmp/ddp_stacks_other_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) ::_exit(11);
    ::setenv("DDPRUN_RUNTIME_DIR", tmpl, 1);
    const std::string dir = tmpl;
    write_record(dir + "/job.1.json", ::getppid(), dir + "/nothing.sock");
    int code = 0;
    try {
      code = run_stacks_command(command());
    } catch (const Error&) {
      code = 3;
    }
    std::remove((dir + "/job.1.json").c_str());
    ::rmdir(dir.c_str());
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2) << "10/11: the child could not become uid 65534 or make its "
                                       "folder; 3: the other user's pid was taken for an agent";
}

TEST_F(StacksCommandTrust, ASocketServedByAnotherProcessIsRefused) {
  // The record names a pid that runs (the test's parent, this user's) but the socket is
  // served by this process: the kernel's peer credentials do not match the record.
  const std::string socket = dir_ + "/agent.sock";
  std::thread server = serve_once(socket, "{}");
  write_record(dir_ + "/job.1.json", ::getppid(), socket);
  try {
    run_stacks_command(command());
    ADD_FAILURE() << "a socket of another process was believed";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("is not that agent's: it is served by pid " +
                                         std::to_string(::getpid()) + ", not by the agent's pid " +
                                         std::to_string(::getppid())),
              std::string::npos)
        << e.what();
  }
  // Unblock the server thread if the client never connected.
  UniqueFd poke(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
  (void)::connect(poke.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  poke.reset();
  server.join();
}

TEST_F(StacksCommandTrust, WhatTheWorkersSentIsPrintedWithItsControlCharactersEscaped) {
  RankStacks rank;
  rank.global_rank = 0;
  rank.pid = 42;
  rank.host = "node";
  rank.tool = "py-spy";
  ThreadStack thread;
  thread.tid = 42;
  thread.name = "MainThread";
  // A function name that would set the terminal's title and clear the screen.
  thread.frames.push_back({"evil\x1b]0;pwned\x07\x1b[2J", "train.py", 3});
  rank.threads.push_back(thread);
  const nlohmann::json answer = {{"run_id", "job"},
                                 {"nodes", 1},
                                 {"answered", {0}},
                                 {"stacks", nlohmann::json::parse(encode_stacks({rank}))},
                                 {"notes", {"note\x1b[31m red"}}};
  const std::string socket = dir_ + "/agent.sock";
  std::thread server = serve_once(socket, answer.dump());
  write_record(dir_ + "/job." + std::to_string(::getpid()) + ".json", ::getpid(), socket);
  ::testing::internal::CaptureStdout();
  run_stacks_command(command());
  const std::string out = ::testing::internal::GetCapturedStdout();
  server.join();
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_EQ(out.find('\x07'), std::string::npos) << out;
  EXPECT_NE(out.find("evil\\x1b]0;pwned\\x07\\x1b[2J"), std::string::npos) << out;
  EXPECT_NE(out.find("ddprun stacks: note\\x1b[31m red"), std::string::npos) << out;
}

TEST_F(StacksCommandTrust, AnAnswerOverTheCapIsAProtocolError) {
  const std::string socket = dir_ + "/agent.sock";
  std::thread server = serve_once(socket, std::string((size_t{128} << 20) + 4096, ' '));
  write_record(dir_ + "/job." + std::to_string(::getpid()) + ".json", ::getpid(), socket);
  try {
    run_stacks_command(command());
    ADD_FAILURE() << "an answer of over 128 MiB was read whole";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("sent more than 128 MiB"), std::string::npos) << e.what();
  }
  server.join();
}

}  // namespace
}  // namespace ddp::launcher
