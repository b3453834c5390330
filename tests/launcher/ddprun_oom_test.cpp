// End to end: ddprun runs, inside a memory-limited cgroup this test creates, a worker that
// allocates until the kernel's out-of-memory killer ends it; ddprun must say so (not just
// "signal 9"), with the limit.
//
// Needs a writable memory cgroup hierarchy (root, or a delegated cgroup): cgroup v1's memory
// controller (a child of this process's own memory cgroup) or cgroup v2 (a sibling of this
// process's cgroup, since a v2 cgroup holding processes cannot enable controllers for its
// children). Where none can be made, it prints why and exits 77 (ctest's SKIP_RETURN_CODE).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace {

constexpr int kSkip = 77;
constexpr long kLimitMiB = 64;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool write_text(const std::string& path, const std::string& text, std::string* error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    *error = "cannot write '" + text + "' to " + path + ": " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return false;
  }
  ::close(fd);
  return true;
}

bool exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

struct TestCgroup {
  std::string dir;
  int version = 0;
};

// Where to make the test's cgroup: "" and `why` set when this machine does not let us.
TestCgroup choose_cgroup(std::string* why) {
  std::istringstream in(read_text("/proc/self/cgroup"));
  std::string line, v1_path, v2_path;
  bool have_v2 = false;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (line.compare(0, a, "0") == 0 && b == a + 1) {
      v2_path = line.substr(b + 1);
      have_v2 = true;
    } else if (controllers.find(",memory,") != std::string::npos) {
      v1_path = line.substr(b + 1);
    }
  }
  const std::string name = "/ddp_oom_test_" + std::to_string(::getpid());
  if (!v1_path.empty() && exists("/sys/fs/cgroup/memory/cgroup.procs")) {
    if (v1_path == "/") v1_path.clear();
    return {"/sys/fs/cgroup/memory" + v1_path + name, 1};
  }
  if (have_v2 && exists("/sys/fs/cgroup/cgroup.controllers")) {
    // The root may hold processes and still enable controllers for its children.
    const std::string parent = v2_path == "/" ? "" : v2_path.substr(0, v2_path.rfind('/'));
    const std::string controllers =
        read_text("/sys/fs/cgroup" + parent + "/cgroup.subtree_control");
    if (controllers.find("memory") != std::string::npos) {
      return {"/sys/fs/cgroup" + parent + name, 2};
    }
    *why = "the cgroup v2 parent /sys/fs/cgroup" + parent +
           " does not enable the memory controller for its children";
    return {};
  }
  *why = "no memory cgroup hierarchy is mounted at /sys/fs/cgroup/memory or /sys/fs/cgroup";
  return {};
}

bool limit_memory(const TestCgroup& c, std::string* why) {
  const std::string bytes = std::to_string(kLimitMiB << 20);
  if (c.version == 1) {
    if (!write_text(c.dir + "/memory.limit_in_bytes", bytes, why)) return false;
    // With swap accounting, memory+swap must be limited too, or the worker swaps instead.
    if (exists(c.dir + "/memory.memsw.limit_in_bytes")) {
      return write_text(c.dir + "/memory.memsw.limit_in_bytes", bytes, why);
    }
    return true;
  }
  if (!write_text(c.dir + "/memory.max", bytes, why)) return false;
  if (exists(c.dir + "/memory.swap.max")) return write_text(c.dir + "/memory.swap.max", "0", why);
  return true;
}

void remove_cgroup(const std::string& dir) {
  // The memory cgroup can be busy for a moment after its last process is reaped.
  for (int i = 0; i < 200 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// `output`: ddprun's output when not printed yet.
int fail(const std::string& what, const std::string& output = "") {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  if (!output.empty()) std::fprintf(stderr, "--- ddprun output ---\n%s\n", output.c_str());
  return 1;
}

}  // namespace

int main() {
  std::string why;
  const TestCgroup cgroup = choose_cgroup(&why);
  if (cgroup.dir.empty()) {
    std::printf("SKIP: cannot make a memory-limited cgroup: %s\n", why.c_str());
    return kSkip;
  }
  if (::mkdir(cgroup.dir.c_str(), 0755) != 0) {
    std::printf("SKIP: cannot create cgroup %s: %s (needs root or a delegated cgroup)\n",
                cgroup.dir.c_str(), std::strerror(errno));
    return kSkip;
  }
  if (!limit_memory(cgroup, &why)) {
    ::rmdir(cgroup.dir.c_str());
    std::printf("SKIP: cannot limit cgroup %s: %s\n", cgroup.dir.c_str(), why.c_str());
    return kSkip;
  }
  char out_path[] = "/tmp/ddprun_oom_test_XXXXXX";
  const int out_fd = ::mkstemp(out_path);
  if (out_fd < 0) {
    ::rmdir(cgroup.dir.c_str());
    return fail(std::string("mkstemp: ") + std::strerror(errno));
  }

  const pid_t pid = ::fork();
  if (pid == 0) {
    // ddprun and so its worker run in the limited cgroup; this test process stays outside.
    std::string error;
    if (!write_text(cgroup.dir + "/cgroup.procs", "0", &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      ::_exit(99);
    }
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(out_fd, STDERR_FILENO);
    ::execl(DDPRUN_BIN, DDPRUN_BIN, "--nproc-per-node", "1", DDP_TEST_WORKER, "allocate", "4096",
            "sleep", "30", static_cast<char*>(nullptr));
    std::fprintf(stderr, "exec %s: %s\n", DDPRUN_BIN, std::strerror(errno));
    ::_exit(98);
  }
  ::close(out_fd);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      remove_cgroup(cgroup.dir);
      return fail("ddprun did not finish within 120 s", read_text(out_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string output = read_text(out_path);
  ::unlink(out_path);
  remove_cgroup(cgroup.dir);
  std::printf("cgroup %s (v%d, limit %ld MiB)\n--- ddprun output ---\n%s", cgroup.dir.c_str(),
              cgroup.version, kLimitMiB, output.c_str());

  if (!WIFEXITED(status) || WEXITSTATUS(status) != 1) {
    return fail("ddprun should exit 1 after its worker was killed");
  }
  for (const std::string& expected :
       {std::string("rank 0 (local rank 0, pid "),
        std::string("was killed by the kernel's out-of-memory killer (SIGKILL): its peak resident "
                    "memory was "),
        std::string("limit 64 MiB, peak "),
        std::string("  cause:      killed by the kernel's out-of-memory killer (SIGKILL)"),
        std::string("(evidence: ")}) {
    if (output.find(expected) == std::string::npos) {
      return fail("expected '" + expected + "' in ddprun's output");
    }
  }
  if (output.find("killed by SIGKILL from outside") != std::string::npos) {
    return fail("an out-of-memory kill must not be reported as a SIGKILL from outside");
  }
  std::printf("PASS\n");
  return 0;
}
