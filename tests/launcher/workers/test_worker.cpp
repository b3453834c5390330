// A scriptable worker for the launcher tests. Its arguments are steps run in order:
//   env                          print the worker environment contract as "ENV rank=<RANK> K=V ..."
//   print TEXT / eprint TEXT     a line on stdout / stderr
//   stderr-lines N               N numbered lines on stderr ("stderr line <i>")
//   record-signals DIR           on SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 create
//                                DIR/<rank>.<restart>.<SIGNAME>; terminating ones then exit 128+sig
//   ignore-term                  ignore SIGTERM
//   ready DIR                    write this pid into DIR/ready.<rank>.<restart>
//   await-peers DIR              wait (up to 30 s) until every rank of this attempt is ready
//   await-exit-of-rank R DIR     on the other ranks, wait (up to 30 s) until rank R's process
//                                of this attempt (its pid in DIR/ready.R.<restart>) is gone:
//                                ddprun has reaped it
//   grandchild                   fork a process that leaves the group (setsid), ignores
//                                SIGTERM and sleeps for 600 s
//   sleep SECONDS                sleep, resuming after handled signals
//   sleep-if-restart-below K S   sleep S seconds when TORCHELASTIC_RESTART_COUNT < K
//   error-file-if-rank R MSG     write PyTorch's @record error file when RANK == R
//   fail-if-rank R CODE K        exit CODE when RANK == R and TORCHELASTIC_RESTART_COUNT < K
//   crash-if-rank R SIGNAL       kill itself with SIGNAL (a number) when RANK == R
//   exit CODE                    exit now
//   vfork-sleep-if-rank R S      when RANK == R, vfork a child that sleeps S seconds: until it
//                                exits, this process waits in the kernel in uninterruptible
//                                sleep (state D; killable only by SIGKILL)
//   allocate MIB                 allocate and touch MIB MiB, 4 MiB at a time, never freed (in a
//                                memory-limited cgroup the out-of-memory killer ends it)
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

char g_record_prefix[4096];

std::string env_or(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int rank() {
  return std::atoi(env_or("RANK", "-1").c_str());
}
int restart_count() {
  return std::atoi(env_or("TORCHELASTIC_RESTART_COUNT", "0").c_str());
}

void on_signal(int sig) {
  char path[4200];
  std::snprintf(path, sizeof(path), "%s%s", g_record_prefix, sigabbrev_np(sig));
  int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) ::close(fd);
  if (sig != SIGUSR1 && sig != SIGUSR2) ::_exit(128 + sig);
}

void sleep_for(double seconds) {
  timespec left{static_cast<time_t>(seconds),
                static_cast<long>((seconds - static_cast<long>(seconds)) * 1e9)};
  while (::nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string step = argv[i];
    auto arg = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "test_worker: step %s needs an argument\n", step.c_str());
        std::exit(100);
      }
      return argv[++i];
    };
    if (step == "env") {
      std::printf("ENV");
      for (const char* k :
           {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
            "TORCHELASTIC_USE_AGENT_STORE", "DDP_STORE_TOKEN_FILE"}) {
        std::printf(" %s=%s", k, std::getenv(k) ? std::getenv(k) : "<unset>");
      }
      std::printf("\n");
    } else if (step == "print") {
      std::printf("%s\n", arg().c_str());
    } else if (step == "eprint") {
      std::fprintf(stderr, "%s\n", arg().c_str());
    } else if (step == "stderr-lines") {
      int n = std::atoi(arg().c_str());
      for (int k = 0; k < n; ++k) std::fprintf(stderr, "stderr line %d\n", k);
    } else if (step == "record-signals") {
      std::snprintf(g_record_prefix, sizeof(g_record_prefix), "%s/%d.%d.SIG", arg().c_str(), rank(),
                    restart_count());
      for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::signal(s, on_signal);
    } else if (step == "ignore-term") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (step == "ready") {
      std::string path =
          arg() + "/ready." + std::to_string(rank()) + "." + std::to_string(restart_count());
      std::string tmp = path + ".tmp";
      FILE* f = std::fopen(tmp.c_str(), "w");
      if (f) {
        std::fprintf(f, "%d\n", static_cast<int>(::getpid()));
        std::fclose(f);
        std::rename(tmp.c_str(), path.c_str());
      }
    } else if (step == "await-peers") {
      std::string dir = arg();
      int world = std::atoi(env_or("WORLD_SIZE", "1").c_str());
      for (int r = 0, waited_ms = 0; r < world && waited_ms < 30000;) {
        std::string path =
            dir + "/ready." + std::to_string(r) + "." + std::to_string(restart_count());
        if (::access(path.c_str(), F_OK) == 0) {
          ++r;
        } else {
          sleep_for(0.002);
          waited_ms += 2;
        }
      }
    } else if (step == "await-exit-of-rank") {
      const int of = std::atoi(arg().c_str());
      const std::string path =
          arg() + "/ready." + std::to_string(of) + "." + std::to_string(restart_count());
      for (int waited_ms = 0; of != rank() && waited_ms < 30000; waited_ms += 2) {
        FILE* f = std::fopen(path.c_str(), "r");
        long pid = 0;
        const bool read = f != nullptr && std::fscanf(f, "%ld", &pid) == 1;
        if (f != nullptr) std::fclose(f);
        if (read && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) break;
        sleep_for(0.002);
      }
    } else if (step == "grandchild") {
      std::fflush(nullptr);
      if (::fork() == 0) {
        ::setsid();
        ::signal(SIGTERM, SIG_IGN);
        sleep_for(600);
        ::_exit(0);
      }
    } else if (step == "sleep") {
      std::fflush(nullptr);
      sleep_for(std::atof(arg().c_str()));
    } else if (step == "sleep-if-restart-below") {
      int until = std::atoi(arg().c_str());
      double seconds = std::atof(arg().c_str());
      std::fflush(nullptr);
      if (restart_count() < until) sleep_for(seconds);
    } else if (step == "error-file-if-rank") {
      int r = std::atoi(arg().c_str());
      std::string msg = arg();
      std::string path = env_or("TORCHELASTIC_ERROR_FILE");
      if (r == rank() && !path.empty()) {
        FILE* f = std::fopen(path.c_str(), "w");
        if (f) {
          std::fprintf(f,
                       "{\"message\": {\"message\": \"%s\", \"extraInfo\": {\"py_callstack\": "
                       "\"Traceback: test_worker\", \"timestamp\": \"%ld\"}}}",
                       msg.c_str(), static_cast<long>(std::time(nullptr)));
          std::fclose(f);
        }
      }
    } else if (step == "fail-if-rank") {
      int r = std::atoi(arg().c_str());
      int code = std::atoi(arg().c_str());
      int until = std::atoi(arg().c_str());
      if (r == rank() && restart_count() < until) {
        std::fflush(nullptr);
        std::exit(code);
      }
    } else if (step == "crash-if-rank") {
      int r = std::atoi(arg().c_str());
      int sig = std::atoi(arg().c_str());
      if (r == rank()) {
        std::fflush(nullptr);
        ::signal(sig, SIG_DFL);
        ::raise(sig);
      }
    } else if (step == "allocate") {
      const long mib = std::atol(arg().c_str());
      std::fflush(nullptr);
      // The blocks stay reachable from a static list: a compiler may remove a malloc and
      // memset whose block nothing reads (clang does), and then nothing is allocated.
      static std::vector<char*> kept;
      for (long done = 0; done < mib; done += 4) {
        char* block = static_cast<char*>(std::malloc(4 << 20));
        if (block == nullptr) break;
        std::memset(block, 1, 4 << 20);
        kept.push_back(block);
      }
    } else if (step == "vfork-sleep-if-rank") {
      const int r = std::atoi(arg().c_str());
      const timespec nap{std::atoi(arg().c_str()), 0};
      std::fflush(nullptr);
      if (r == rank()) {
        // The child shares our memory until it exits: only async-signal-safe calls there.
        if (::vfork() == 0) {
          ::nanosleep(&nap, nullptr);
          ::_exit(0);
        }
      }
    } else if (step == "exit") {
      std::fflush(nullptr);
      std::exit(std::atoi(arg().c_str()));
    } else {
      std::fprintf(stderr, "test_worker: unknown step '%s'\n", step.c_str());
      return 100;
    }
    std::fflush(nullptr);
  }
  return 0;
}
