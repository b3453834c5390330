// rdzv_bench: time for N ddprun agents on this machine to form one c10d rendezvous.
//
//   rdzv_bench --ddprun PATH --agents N [--repeat R] [--port P] [--starved-store]
//              [--rdzv-conf KEY=VALUE,...]   (added to every agent's --rdzv-conf)
//
// Starts N agents (`ddprun --nnodes N --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P
// --no-python /bin/true`), each with its stderr on a pipe, and timestamps the moment each one
// prints its "rendezvous round" line, i.e. is past the rendezvous. Prints one JSON line per
// repetition:
//   total_s     first agent started -> last agent past the rendezvous (the headline figure)
//   spawn_s     first agent started -> last agent started (fork/exec of N processes)
//   after_last_start_s  last agent started -> last agent past the rendezvous
//   first_past_s  first agent started -> first agent past the rendezvous (the round formed)
//   exit_s      first agent started -> every agent exited (includes workers and exit barrier)
// Agents that fail are reported with their stderr tail and make the exit code 1.
//
// --starved-store: this process serves the rendezvous store itself, on a thread at nice 19,
// and every agent joins it as a client. That is the store host starved of CPU by the N
// agents (the failure mode of 1024 agents on a small machine), made reproducible.

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/socket.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Agent {
  pid_t pid = -1;
  int fd = -1;
  std::string err;
  bool past = false;
  Clock::time_point past_at;
  int status = 0;
};

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

int run_once(const std::string& ddprun, int n, int port, int repetition,
             const std::string& extra_conf) {
  std::vector<Agent> agents(n);
  std::string nnodes = std::to_string(n);
  const std::string conf =
      "join_timeout=120,close_timeout=60" + (extra_conf.empty() ? "" : "," + extra_conf);
  std::string endpoint = "127.0.0.1:" + std::to_string(port);
  std::string run_id = "bench" + std::to_string(repetition);
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      std::perror("pipe2");
      return 1;
    }
    // posix_spawn (vfork underneath): starting 1024 agents must not be limited by copying
    // this process's page tables.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, p[1], 2);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    const char* argv[] = {
        ddprun.c_str(),   "--nnodes",    nnodes.c_str(),    "--nproc-per-node", "1",
        "--rdzv-backend", "c10d",        "--rdzv-endpoint", endpoint.c_str(),   "--rdzv-id",
        run_id.c_str(),   "--rdzv-conf", conf.c_str(),      "--no-python",      "/bin/true",
        nullptr};
    pid_t pid = -1;
    int rc =
        ::posix_spawn(&pid, argv[0], &actions, nullptr, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      std::fprintf(stderr, "rdzv_bench: cannot start %s: %s\n", argv[0], std::strerror(rc));
      return 1;
    }
    ::close(p[1]);
    agents[i].pid = pid;
    agents[i].fd = p[0];
  }
  auto t_last_start = Clock::now();

  int open_fds = n;
  std::vector<pollfd> fds;
  std::vector<int> owner;
  while (open_fds > 0) {
    fds.clear();
    owner.clear();
    for (int i = 0; i < n; ++i) {
      if (agents[i].fd >= 0) {
        fds.push_back({agents[i].fd, POLLIN, 0});
        owner.push_back(i);
      }
    }
    if (::poll(fds.data(), fds.size(), 200000) <= 0) {
      std::fprintf(stderr, "rdzv_bench: no progress for 200 s; giving up\n");
      for (auto& a : agents) ::kill(a.pid, SIGKILL);
      return 1;
    }
    auto now = Clock::now();
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Agent& a = agents[owner[k]];
      char buf[4096];
      ssize_t r = ::read(a.fd, buf, sizeof(buf));
      if (r > 0) {
        a.err.append(buf, static_cast<size_t>(r));
        if (!a.past && a.err.find("rendezvous round") != std::string::npos) {
          a.past = true;
          a.past_at = now;
        }
      } else {
        ::close(a.fd);
        a.fd = -1;
        --open_fds;
      }
    }
  }
  int failed = 0;
  for (auto& a : agents) {
    ::waitpid(a.pid, &a.status, 0);
    if (!WIFEXITED(a.status) || WEXITSTATUS(a.status) != 0 || !a.past) {
      if (++failed <= 3) std::fprintf(stderr, "agent %d failed:\n%s\n", a.pid, a.err.c_str());
    }
  }
  auto t_exit = Clock::now();
  if (failed > 0) {
    std::fprintf(stderr, "rdzv_bench: %d of %d agents failed\n", failed, n);
    return 1;
  }
  Clock::time_point last_past = t0;
  Clock::time_point first_past = agents[0].past_at;
  for (auto& a : agents) {
    last_past = std::max(last_past, a.past_at);
    first_past = std::min(first_past, a.past_at);
  }
  std::printf(
      "{\"bench\":\"rendezvous\",\"impl\":\"ddprun\",\"agents\":%d,\"repetition\":%d,"
      "\"total_s\":%.3f,\"spawn_s\":%.3f,\"after_last_start_s\":%.3f,\"first_past_s\":%.3f,"
      "\"exit_s\":%.3f}\n",
      n, repetition, seconds(last_past - t0), seconds(t_last_start - t0),
      seconds(last_past - t_last_start), seconds(first_past - t0), seconds(t_exit - t0));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ddprun;
  int n = 64, repeat = 1, port = 0;
  bool starved_store = false;
  std::string extra_conf;
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--starved-store") {
      starved_store = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "rdzv_bench: %s needs a value\n", flag.c_str());
      return 2;
    }
    if (flag == "--ddprun")
      ddprun = argv[i + 1];
    else if (flag == "--agents")
      n = std::atoi(argv[i + 1]);
    else if (flag == "--repeat")
      repeat = std::atoi(argv[i + 1]);
    else if (flag == "--port")
      port = std::atoi(argv[i + 1]);
    else if (flag == "--rdzv-conf")
      extra_conf = argv[i + 1];
    else {
      std::fprintf(stderr, "rdzv_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (ddprun.empty() || n < 1 || repeat < 1) {
    std::fprintf(stderr,
                 "usage: rdzv_bench --ddprun PATH --agents N [--repeat R] [--port P] "
                 "[--starved-store]\n");
    return 2;
  }
  // One pipe per agent here, two connections per agent at the store: lift the fd limit.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  int rc = 0;
  for (int r = 0; r < repeat && rc == 0; ++r) {
    int p = port > 0 ? port : ddp::net::free_tcp_port("127.0.0.1");
    std::unique_ptr<ddp::TcpStoreServer> server;
    std::thread serving;
    if (starved_store) {
      ddp::TcpStoreServerOptions so;
      so.port = static_cast<uint16_t>(p);
      so.token = "";
      server = std::make_unique<ddp::TcpStoreServer>(so);
      serving = std::thread([&server] {
        // Linux nice values are per thread: only the serving thread is starved.
        ::setpriority(PRIO_PROCESS, static_cast<int>(::syscall(SYS_gettid)), 19);
        server->run();
      });
    }
    rc = run_once(ddprun, n, p, r, extra_conf);
    if (server) {
      server->stop();
      serving.join();
    }
  }
  return rc;
}
