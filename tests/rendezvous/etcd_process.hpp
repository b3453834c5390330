#pragma once
// A real etcd for tests: `members` etcd processes on loopback forming one cluster, ports below
// the ephemeral range, data in a fresh temporary directory, every process killed (SIGKILL) and
// the directory removed when the object goes. etcd_binary() is empty when etcd is not
// installed (Debian etcd-server; `scripts/install-deps.sh test` installs it): tests then skip
// with that reason.

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "../support/free_port_range.hpp"
#include "ddp/rendezvous/etcd/etcd_store.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/remove_tree.hpp"

namespace ddp::rdzv::test {

inline std::string etcd_binary() {
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

#define DDP_SKIP_WITHOUT_ETCD()                                           \
  if (::ddp::rdzv::test::etcd_binary().empty()) {                         \
    GTEST_SKIP() << "etcd is not installed (Debian package etcd-server; " \
                    "scripts/install-deps.sh test installs it)";          \
  }

class EtcdProcess {
 public:
  // `extra` is appended to every member's command line (e.g. TLS flags).
  explicit EtcdProcess(int members = 1, std::vector<std::string> extra = {}, bool https = false)
      : https_(https), extra_(std::move(extra)) {
    char dir[] = "/tmp/ddp_etcd_test_XXXXXX";
    if (::mkdtemp(dir) == nullptr) throw Error("mkdtemp failed");
    dir_ = dir;
    // Another test may pick the same free ports before either binds them: the member that
    // loses exits ("address already in use") while the other test's etcd answers on its port.
    // Then start again on ports found free now (the winner holds the old ones).
    for (int attempt = 1;; ++attempt) {
      int base = ddp::test::free_ports_below_ephemeral_range(2 * members);
      std::vector<std::string> peers;
      client_ports_.clear();
      peer_ports_.clear();
      for (int i = 0; i < members; ++i) {
        client_ports_.push_back(base + 2 * i);
        peer_ports_.push_back(base + 2 * i + 1);
        peers.push_back(fmt::format("m{}=http://127.0.0.1:{}", i, peer_ports_.back()));
      }
      cluster_ = fmt::format("{}", fmt::join(peers, ","));
      pids_.assign(members, -1);
      for (int i = 0; i < members; ++i) start(i);
      if (wait_healthy(/*may_retry=*/attempt < 3)) break;
      for (int i = 0; i < members; ++i) kill(i);
      // The abandoned cluster's data dirs.
      for (int i = 0; i < members; ++i) ddp::remove_tree(fmt::format("{}/m{}", dir_, i));
    }
  }
  ~EtcdProcess() {
    for (int i = 0; i < static_cast<int>(pids_.size()); ++i) kill(i);
    std::error_code ec;
    ddp::remove_tree(dir_, ec);
  }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // "127.0.0.1:P1,127.0.0.1:P2,..." as --rdzv-endpoint takes it.
  std::string endpoint_list() const {
    std::vector<std::string> e;
    for (int p : client_ports_) e.push_back(fmt::format("127.0.0.1:{}", p));
    return fmt::format("{}", fmt::join(e, ","));
  }
  std::vector<Endpoint> endpoints() const {
    std::vector<Endpoint> e;
    for (int p : client_ports_) e.push_back({"127.0.0.1", static_cast<uint16_t>(p)});
    return e;
  }
  const std::string& dir() const { return dir_; }

  // Sends `sig` to member i (SIGSTOP: a member that accepts connections and never answers).
  void signal(int i, int sig) {
    if (pids_[i] > 0) ::kill(pids_[i], sig);
  }

  // SIGKILL member i and reap it.
  void kill(int i) {
    if (pids_[i] <= 0) return;
    ::kill(pids_[i], SIGKILL);
    ::waitpid(pids_[i], nullptr, 0);
    pids_[i] = -1;
  }

 private:
  void start(int i) {
    const std::string scheme = https_ ? "https" : "http";
    std::string client = fmt::format("{}://127.0.0.1:{}", scheme, client_ports_[i]);
    std::string peer = fmt::format("http://127.0.0.1:{}", peer_ports_[i]);
    std::vector<std::string> args = {etcd_binary(),
                                     "--name",
                                     fmt::format("m{}", i),
                                     "--data-dir",
                                     fmt::format("{}/m{}", dir_, i),
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     cluster_,
                                     "--initial-cluster-state",
                                     "new"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_t pid = ::fork();
    if (pid == 0) {
      // etcd dies with the test even when the test is killed (a ctest timeout).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      // etcd logs to stderr: into m<i>.log, which a failed start quotes.
      int log = ::open(log_path(i).c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (log >= 0) {
        ::dup2(log, 1);
        ::dup2(log, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pids_[i] = pid;
  }

  std::string log_path(int i) const { return fmt::format("{}/m{}.log", dir_, i); }

  // Until every member answers a read on its own port (a cluster answers once it has a
  // leader); 60 s at most, and at once when a member exited (its log is quoted). False when a
  // member lost its port to another process and `may_retry`: the caller starts again.
  bool wait_healthy(bool may_retry) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int i = 0; i < static_cast<int>(pids_.size()); ++i) {
      for (;;) {
        if (::waitpid(pids_[i], nullptr, WNOHANG) == pids_[i]) {
          pids_[i] = -1;
          std::ifstream in(log_path(i));
          std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          if (may_retry && log.find("address already in use") != std::string::npos) return false;
          throw Error(fmt::format("etcd member {} exited at start: {}", i, log.substr(0, 2000)));
        }
        try {
          probe(i);
          // An answer from someone else's etcd on that port does not count.
          if (listens_on(pids_[i], client_ports_[i])) break;
        } catch (const Error& e) {
          if (std::chrono::steady_clock::now() > deadline) throw;
        }
        if (std::chrono::steady_clock::now() > deadline) {
          throw Error(fmt::format("etcd member {}: port {} answers but is not its own", i,
                                  client_ports_[i]));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return true;
  }

  // Whether process `pid` holds the listening TCP socket of 127.0.0.1:`port` (/proc/net/tcp's
  // LISTEN entry for the port, whose inode is one of the process's descriptors).
  static bool listens_on(pid_t pid, int port) {
    std::ifstream tcp("/proc/net/tcp");
    std::string line;
    std::getline(tcp, line);  // header
    const std::string local = fmt::format(":{:04X}", port);
    std::vector<std::string> inodes;
    while (std::getline(tcp, line)) {
      std::istringstream f(line);
      std::string slot, local_addr, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> slot >> local_addr >> remote >> state >> queues >> timer >> retr >> uid >> timeout >>
          inode;
      if (state == "0A" && local_addr.size() > local.size() &&
          local_addr.compare(local_addr.size() - local.size(), local.size(), local) == 0) {
        inodes.push_back("socket:[" + inode + "]");
      }
    }
    std::error_code ec;
    for (const auto& fd :
         std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid), ec)) {
      std::error_code link_ec;
      const std::string target = std::filesystem::read_symlink(fd.path(), link_ec).string();
      for (const auto& in : inodes) {
        if (target == in) return true;
      }
    }
    return false;
  }

  void probe(int i) {
    {
      EtcdStoreOptions o;
      o.endpoints = {endpoints()[i]};
      o.https = https_;
      o.connect_timeout = std::chrono::milliseconds(500);
      o.read_timeout = std::chrono::seconds(10);
      for (size_t k = 0; k + 1 < extra_.size(); ++k) {
        if (extra_[k] == "--trusted-ca-file") o.cacert = extra_[k + 1];
        if (extra_[k] == "--cert-file") o.cert = extra_[k + 1];
        if (extra_[k] == "--key-file") o.key = extra_[k + 1];
      }
      EtcdStore store(o);
    }
  }

  bool https_;
  std::vector<std::string> extra_;
  std::string dir_;
  std::string cluster_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<pid_t> pids_;
};

}  // namespace ddp::rdzv::test
