// The doctor against real endpoints on 127.0.0.1 only: a listening socket, a real TcpStore
// (with and without token and clock beacon), a closed port; plus interface variables, GPU
// lists (a fake /proc/driver/nvidia/gpus tree) and unresolvable names that fail locally.
#include "ddp/cluster/doctor.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "ddp/cluster/clock_beacon.hpp"
#include "ddp/cluster/netinfo.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::cluster {
namespace {

using namespace std::chrono_literals;

// A host name whose 70-character label cannot be encoded in a DNS query, so resolution fails
// inside the resolver without sending anything.
const std::string kUnresolvable = std::string(70, 'x') + ".invalid";

const CheckResult* find(const std::vector<CheckResult>& results, const std::string& name) {
  for (const auto& r : results) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

std::string dump(const std::vector<CheckResult>& results) {
  std::ostringstream out;
  print_doctor_report(out, results);
  return out.str();
}

// Options that check only what a test sets: an empty environment, no GPUs, no NCCL.
DoctorOptions base_options() {
  DoctorOptions o;
  o.env = EnvMap{};
  o.nvidia_dir = "/nonexistent/nvidia";
  o.nccl_library = "libddp-test-no-such-nccl.so";
  o.timeout = 2000ms;
  o.detect.hostname = "testhost";
  return o;
}

// `results` may be a temporary: it is bound once, so the pointer below stays valid.
#define EXPECT_CHECK(results, name, status_, text)                                             \
  do {                                                                                         \
    const std::vector<CheckResult>& all_ = (results);                                          \
    const CheckResult* r_ = find(all_, name);                                                  \
    ASSERT_NE(r_, nullptr) << "no check " << name << "\n" << dump(all_);                       \
    EXPECT_EQ(r_->status, status_) << dump(all_);                                              \
    EXPECT_NE(r_->verdict.find(text), std::string::npos) << r_->verdict << "\n" << dump(all_); \
  } while (0)

TEST(Doctor, NoEndpointSkipsTheNetworkChecks) {
  auto results = run_doctor(base_options());
  EXPECT_CHECK(results, "endpoint", CheckStatus::kSkip, "pass --endpoint HOST:PORT");
  EXPECT_CHECK(results, "cluster", CheckStatus::kOk, "no cluster detected");
  EXPECT_EQ(doctor_exit_code(results), 0);
}

TEST(Doctor, ListeningSocketConnectsButIsNoStore) {
  net::Socket listener = net::listen_tcp("127.0.0.1", 0, 8);
  DoctorOptions o = base_options();
  o.endpoint = "127.0.0.1:" + std::to_string(net::local_port(listener.fd()));
  o.timeout = 300ms;  // the handshake waits this long for a reply that never comes
  auto results = run_doctor(o);
  EXPECT_CHECK(results, "resolve", CheckStatus::kOk, "127.0.0.1 resolves to 127.0.0.1");
  EXPECT_CHECK(results, "route", CheckStatus::kOk, "via lo");
  EXPECT_CHECK(results, "connect", CheckStatus::kOk, "connected to 127.0.0.1:");
  EXPECT_CHECK(results, "store-auth", CheckStatus::kFail,
               "did not complete the ddp store handshake");
  EXPECT_CHECK(results, "clock-skew", CheckStatus::kSkip, "no store handshake");
  EXPECT_EQ(doctor_exit_code(results), 1);
}

TEST(Doctor, ClosedPortIsRefused) {
  uint16_t port;
  {
    net::Socket probe = net::listen_tcp("127.0.0.1", 0, 1);
    port = net::local_port(probe.fd());
  }  // closed: nothing listens there now
  DoctorOptions o = base_options();
  o.endpoint = "127.0.0.1:" + std::to_string(port);
  auto results = run_doctor(o);
  EXPECT_CHECK(results, "connect", CheckStatus::kFail, "refused");
  EXPECT_CHECK(results, "connect", CheckStatus::kFail, "start the master first");
  EXPECT_CHECK(results, "store-auth", CheckStatus::kSkip, "cannot connect");
  EXPECT_EQ(doctor_exit_code(results), 1);
}

// A real store on a free local port, optionally with a token and a clock beacon.
struct LocalStore {
  explicit LocalStore(const std::string& token) {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.is_server = true;
    o.token = token;
    o.timeout = 5s;
    store = std::make_shared<TcpStore>(o);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(store->port()); }
  std::shared_ptr<TcpStore> store;
};

TEST(Doctor, StoreWithTokenAndClock) {
  LocalStore server("s3cret");
  ClockBeacon beacon(server.store);
  DoctorOptions o = base_options();
  o.endpoint = server.endpoint();
  o.token = "s3cret";
  auto results = run_doctor(o);
  EXPECT_CHECK(results, "store-auth", CheckStatus::kOk, "accepted this client (--token-file)");
  // Same machine, same clock: the estimate must be ok (well under a second).
  EXPECT_CHECK(results, "clock-skew", CheckStatus::kOk, "ms from ours");
  EXPECT_EQ(doctor_exit_code(results), 0) << dump(results);
}

TEST(Doctor, WrongOrMissingTokenIsRefused) {
  LocalStore server("s3cret");
  DoctorOptions o = base_options();
  o.endpoint = server.endpoint();
  o.token = "wrong";
  auto results = run_doctor(o);
  EXPECT_CHECK(results, "store-auth", CheckStatus::kFail, "token mismatch");
  o.token = "";
  results = run_doctor(o);
  EXPECT_CHECK(results, "store-auth", CheckStatus::kFail, "this client has none");
  // The token can come from the environment, as for the workers.
  o.token.reset();
  o.env = EnvMap{{"DDP_STORE_TOKEN", "s3cret"}};
  results = run_doctor(o);
  EXPECT_CHECK(results, "store-auth", CheckStatus::kOk, "DDP_STORE_TOKEN");
  // Or from the file ddprun names for its workers (--rdzv-conf token_file=).
  std::string path = ::testing::TempDir() + "doctor-token";
  { std::ofstream(path) << "s3cret\n"; }
  ::chmod(path.c_str(), 0600);
  o.env = EnvMap{{"DDP_STORE_TOKEN_FILE", path}};
  results = run_doctor(o);
  EXPECT_CHECK(results, "store-auth", CheckStatus::kOk, "DDP_STORE_TOKEN_FILE");
  std::remove(path.c_str());
}

TEST(Doctor, StoreWithoutClockSkipsSkew) {
  LocalStore server("");
  DoctorOptions o = base_options();
  o.endpoint = server.endpoint();
  auto results = run_doctor(o);
  EXPECT_CHECK(results, "store-auth", CheckStatus::kOk, "no token");
  EXPECT_CHECK(results, "clock-skew", CheckStatus::kSkip, "publishes no clock");
}

TEST(Doctor, SkewedClockIsReported) {
  LocalStore server("");
  // A publisher two minutes ahead, refreshed like a beacon. The first value is set before the
  // doctor runs, so the check never races the publisher thread's start.
  server.store->set(ClockBeacon::kClockKey, std::to_string(ClockBeacon::wall_ms() + 120000));
  std::atomic<bool> stop{false};
  std::thread ahead([&] {
    while (!stop) {
      server.store->set(ClockBeacon::kClockKey, std::to_string(ClockBeacon::wall_ms() + 120000));
      std::this_thread::sleep_for(ClockBeacon::kPeriod);
    }
  });
  DoctorOptions o = base_options();
  o.endpoint = server.endpoint();
  auto results = run_doctor(o);
  stop = true;
  ahead.join();
  EXPECT_CHECK(results, "clock-skew", CheckStatus::kFail, "sync the clocks");
}

TEST(Doctor, EndpointFromMasterAddrAndPort) {
  LocalStore server("");
  DoctorOptions o = base_options();
  o.env =
      EnvMap{{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", std::to_string(server.store->port())}};
  auto results = run_doctor(o);
  EXPECT_CHECK(results, "MASTER_ADDR", CheckStatus::kOk, "MASTER_ADDR=localhost resolves to");
  EXPECT_CHECK(results, "connect", CheckStatus::kOk, "connected to");
}

TEST(Doctor, UnresolvableNamesFail) {
  DoctorOptions o = base_options();
  o.env = EnvMap{{"MASTER_ADDR", kUnresolvable}, {"MASTER_PORT", "29500"}};
  auto results = run_doctor(o);
  EXPECT_CHECK(results, "MASTER_ADDR", CheckStatus::kFail, "cannot resolve");
  EXPECT_CHECK(results, "resolve", CheckStatus::kFail, "cannot resolve");
  EXPECT_CHECK(results, "connect", CheckStatus::kSkip, "does not resolve");
  EXPECT_EQ(doctor_exit_code(results), 1);
}

TEST(Doctor, BadPortsAndEndpoints) {
  DoctorOptions o = base_options();
  o.env = EnvMap{{"MASTER_PORT", "70000"}};
  EXPECT_CHECK(run_doctor(o), "MASTER_PORT", CheckStatus::kFail, "not a port number");
  o.endpoint = "127.0.0.1:0";
  EXPECT_THROW(run_doctor(o), UsageError);
  o.endpoint = "::1:29500";
  EXPECT_THROW(run_doctor(o), UsageError);
  EXPECT_EQ(parse_endpoint("[::1]:29400"), std::make_pair(std::string("::1"), uint16_t{29400}));
  EXPECT_EQ(parse_endpoint("node7"), std::make_pair(std::string("node7"), uint16_t{29500}));
}

TEST(Doctor, InterfaceVariablesNamingMissingInterfacesFail) {
  DoctorOptions o = base_options();
  o.env = EnvMap{{"NCCL_SOCKET_IFNAME", "ddpnosuch"},
                 {"GLOO_SOCKET_IFNAME", "ddpnosuch0"},
                 {"DDP_GLOO_IFNAME", "lo"}};
  auto results = run_doctor(o);
  EXPECT_CHECK(results, "NCCL_SOCKET_IFNAME", CheckStatus::kFail, "selects no usable interface");
  EXPECT_CHECK(results, "NCCL_SOCKET_IFNAME", CheckStatus::kFail, "lo 127.0.0.1");
  EXPECT_CHECK(results, "GLOO_SOCKET_IFNAME", CheckStatus::kFail, "no interface named ddpnosuch0");
  EXPECT_CHECK(results, "DDP_GLOO_IFNAME", CheckStatus::kOk, "DDP_GLOO_IFNAME=lo is lo");
  EXPECT_EQ(doctor_exit_code(results), 1);
}

TEST(Doctor, NcclIfnamePrefixExactAndExclude) {
  DoctorOptions o = base_options();
  o.env = EnvMap{{"NCCL_SOCKET_IFNAME", "l"}};
  EXPECT_CHECK(run_doctor(o), "NCCL_SOCKET_IFNAME", CheckStatus::kOk, "selects lo");
  o.env = EnvMap{{"NCCL_SOCKET_IFNAME", "=l"}};
  EXPECT_CHECK(run_doctor(o), "NCCL_SOCKET_IFNAME", CheckStatus::kFail, "no name matches");
  // Excluding every interface leaves nothing.
  std::string all;
  for (const auto& i : list_interfaces()) all += (all.empty() ? "" : ",") + i.name;
  o.env = EnvMap{{"NCCL_SOCKET_IFNAME", "^=" + all}};
  EXPECT_CHECK(run_doctor(o), "NCCL_SOCKET_IFNAME", CheckStatus::kFail, "selects no usable");
}

// A fake driver tree with two GPUs, as /proc/driver/nvidia/gpus lays them out.
class DoctorGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/ddp-gpus-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
    add_gpu("0000:3b:00.0", "GPU-1111aaaa-0000-0000-0000-000000000000");
    add_gpu("0000:86:00.0", "GPU-2222bbbb-0000-0000-0000-000000000000");
  }
  void TearDown() override { std::system(("rm -rf '" + root_ + "'").c_str()); }
  void add_gpu(const std::string& bus, const std::string& uuid) {
    std::string d = root_ + "/" + bus;
    ASSERT_EQ(mkdir(d.c_str(), 0755), 0);
    std::ofstream(d + "/information")
        << "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\n"
        << "GPU UUID: \t " << uuid << "\nBus Location: \t " << bus << "\n";
  }
  std::vector<CheckResult> run(const EnvMap& env) {
    DoctorOptions o = base_options();
    o.nvidia_dir = root_;
    o.env = env;
    return run_doctor(o);
  }
  std::string root_;
};

TEST_F(DoctorGpus, ListsModels) {
  EXPECT_CHECK(run({}), "gpus", CheckStatus::kOk, "2 GPUs visible: 2 x NVIDIA H100 80GB HBM3");
  // GPUs but no NCCL library: the nccl backend is unavailable.
  EXPECT_CHECK(run({}), "nccl", CheckStatus::kWarn, "cannot be loaded");
}

TEST_F(DoctorGpus, VisibleDevicesInRangeByIndexOrUuid) {
  EXPECT_CHECK(run({{"CUDA_VISIBLE_DEVICES", "1,0"}}), "gpus", CheckStatus::kOk, "2 of 2 GPUs");
  EXPECT_CHECK(run({{"CUDA_VISIBLE_DEVICES", "GPU-2222"}}), "gpus", CheckStatus::kOk,
               "1 of 2 GPUs");
}

TEST_F(DoctorGpus, VisibleDevicesOutOfRangeFail) {
  EXPECT_CHECK(run({{"CUDA_VISIBLE_DEVICES", "0,2"}}), "gpus", CheckStatus::kFail,
               "'2' is not one of this node's 2 GPUs (indices 0-1");
  EXPECT_CHECK(run({{"CUDA_VISIBLE_DEVICES", "GPU-9999"}}), "gpus", CheckStatus::kFail,
               "'GPU-9999' is not one of");
  EXPECT_CHECK(run({{"CUDA_VISIBLE_DEVICES", "0,0"}}), "gpus", CheckStatus::kFail, "twice");
  EXPECT_CHECK(run({{"CUDA_VISIBLE_DEVICES", ""}}), "gpus", CheckStatus::kWarn,
               "hides every GPU of the 2");
}

TEST(Doctor, NoGpusNoNcclIsFine) {
  auto results = run_doctor(base_options());
  EXPECT_CHECK(results, "gpus", CheckStatus::kOk, "no NVIDIA GPU");
  EXPECT_CHECK(results, "nccl", CheckStatus::kOk, "not needed without GPUs");
}

// Debian's two BLAS builds (libblas3, a LibTorch dependency; libopenblas0-openmp from
// install-deps.sh), loaded by path instead of through the libblas.so.3 alternative.
TEST(Doctor, BlasNamesOpenBlasAndWarnsAboutTheReferenceBlas) {
  const std::string reference = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
  const std::string openblas = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3";
  for (const auto& path : {reference, openblas}) {
    if (access(path.c_str(), R_OK) != 0) {
      GTEST_SKIP() << path << " is absent (not Debian x86_64, or scripts/install-deps.sh test "
                   << "did not run)";
    }
  }
  DoctorOptions o = base_options();
  o.blas_library = reference;
  EXPECT_CHECK(run_doctor(o), "blas", CheckStatus::kWarn, "is the reference BLAS");
  EXPECT_CHECK(run_doctor(o), "blas", CheckStatus::kWarn, "apt-get install libopenblas0-openmp");
  o.blas_library = openblas;
  EXPECT_CHECK(run_doctor(o), "blas", CheckStatus::kOk, "OpenBLAS 0.");
  EXPECT_CHECK(run_doctor(o), "blas", CheckStatus::kOk, "OpenMP");
}

TEST(Doctor, BlasThatIsMissingOrNoBlasIsReported) {
  DoctorOptions o = base_options();
  o.blas_library = "libddp-test-no-such-blas.so";
  EXPECT_CHECK(run_doctor(o), "blas", CheckStatus::kSkip, "cannot be loaded");
  o.blas_library = "libz.so.1";  // loads, but has no sgemm_
  EXPECT_CHECK(run_doctor(o), "blas", CheckStatus::kWarn, "defines no sgemm_");
}

TEST(Doctor, ClusterProblemsAreFailures) {
  DoctorOptions o = base_options();
  o.env = EnvMap{{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "n[3-1]"}};
  EXPECT_CHECK(run_doctor(o), "cluster", CheckStatus::kFail, "reversed range 3-1");
}

TEST(Doctor, ReportHasOneLinePerCheckAndASummary) {
  auto results = run_doctor(base_options());
  std::string text = dump(results);
  size_t lines = std::count(text.begin(), text.end(), '\n');
  EXPECT_EQ(lines, results.size() + 1);
  EXPECT_NE(text.find("[ ok ] cluster"), std::string::npos) << text;
  EXPECT_NE(text.find("doctor: "), std::string::npos) << text;
}

}  // namespace
}  // namespace ddp::cluster
