// DDP across real processes: this binary re-executes itself as ranks ("--worker") with
// torchrun's environment; the ranks meet through init_process_group's env:// TcpStore on a
// free port below the ephemeral range. The test process trains the one-process reference and
// compares.
// "--blas-probe" starts one DDP process with a chosen BLAS preloaded, for DDP's BLAS warning.
// "--worker DIR join" trains uneven inputs under ddp::Join with DDP and ZeroRedundancyOptimizer.
// "--resume" ranks resume from snapshots (SnapshotManager::load_agreed), each from a path of
// its own (node-local disks) or all from one (a shared file system).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../support/free_port_range.hpp"
#include "../../support/wait_or_kill.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/join.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/torch/snapshot/snapshot.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/remove_tree.hpp"
#include "ddp/util/socket.hpp"
#include "models.hpp"

namespace {

namespace fs = std::filesystem;
constexpr int kBatch = 2, kSteps = 3;

// The same data in every process: generated from a fixed seed.
void make_data(int world, std::vector<torch::Tensor>& xs, std::vector<torch::Tensor>& ys) {
  torch::manual_seed(0);
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(torch::randn({world * kBatch, 1, 28, 28}));
    ys.push_back(torch::randint(0, 10, {world * kBatch}, torch::kLong));
  }
}

// One rank: trains its shard and saves the final parameters to <dir>/rank<r>.pt. With
// `mismatch`, the last rank builds a different model (the test expects every rank to fail).
int worker_main(const std::string& dir, bool mismatch) {
  torch::set_num_threads(1);
  ddp::InitOptions opts;
  opts.timeout = std::chrono::seconds(60);
  auto pg = ddp::init_process_group(opts);
  const int rank = pg->rank(), world = pg->size();
  std::vector<torch::Tensor> xs, ys;
  make_data(world, xs, ys);
  if (mismatch) {
    torch::nn::Linear net(4, rank == world - 1 ? 3 : 2);
    ddp::DistributedDataParallel model(net, pg);
    return 0;
  }
  torch::manual_seed(100 + rank);  // different starting points: DDP broadcasts rank 0's
  ddp::test::Cnn net;
  ddp::DistributedDataParallel model(net, pg);
  torch::optim::Adam opt(model.parameters(), 1e-3);
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto out = model(xs[s].narrow(0, rank * kBatch, kBatch));
    torch::nll_loss(out, ys[s].narrow(0, rank * kBatch, kBatch)).backward();
    model.step(opt);
  }
  torch::save(net, (fs::path(dir) / ("rank" + std::to_string(rank) + ".pt")).string());
  return 0;
}

// "--worker DIR join": rank r trains kSteps - r steps of the CNN (uneven inputs) with DDP and
// ZeroRedundancyOptimizer under ddp::Join, then saves its parameters like worker_main.
int join_worker_main(const std::string& dir) {
  torch::set_num_threads(1);
  ddp::InitOptions opts;
  opts.timeout = std::chrono::seconds(60);
  auto pg = ddp::init_process_group(opts);
  const int rank = pg->rank(), world = pg->size();
  std::vector<torch::Tensor> xs, ys;
  make_data(world, xs, ys);
  torch::manual_seed(100 + rank);
  ddp::test::Cnn net;
  ddp::DistributedDataParallel model(net, pg);
  ddp::ZeroRedundancyOptimizer<torch::optim::Adam> opt(model.parameters(),
                                                       torch::optim::AdamOptions(1e-3), pg);
  {
    ddp::Join joined({&model, &opt});
    for (int s = 0; s < kSteps - rank; ++s) {
      opt.zero_grad();
      auto out = model(xs[s].narrow(0, rank * kBatch, kBatch));
      torch::nll_loss(out, ys[s].narrow(0, rank * kBatch, kBatch)).backward();
      opt.step();
    }
  }
  torch::save(net, (fs::path(dir) / ("rank" + std::to_string(rank) + ".pt")).string());
  return 0;
}

// "--resume PATH RESULT_DIR": resumes from PATH ("{rank}" replaced by the rank) with
// load_agreed and writes RESULT_DIR/rank<r>.txt: "epoch N sha256 S", "none" or "error: ...".
int resume_main(std::string path, const std::string& result_dir) {
  ddp::InitOptions opts;
  opts.timeout = std::chrono::seconds(60);
  auto pg = ddp::init_process_group(opts);
  const int rank = pg->rank();
  if (auto at = path.find("{rank}"); at != std::string::npos) {
    path.replace(at, 6, std::to_string(rank));
  }
  std::string result;
  int code = 0;
  try {
    ddp::SnapshotManager snapshots{ddp::SnapshotOptions(path)};
    auto resume = snapshots.load_agreed(*pg);
    result = resume ? "epoch " + std::to_string(resume->snapshot.epochs_run) + " sha256 " +
                          resume->sha256
                    : "none";
  } catch (const ddp::UsageError& e) {
    result = std::string("error: ") + e.what();
    code = 1;
  }
  std::ofstream(fs::path(result_dir) / ("rank" + std::to_string(rank) + ".txt")) << result;
  return code;
}

// "--blas-probe": wraps a CPU module in a world-1 DDP and exits (stderr has its warnings).
int blas_probe_main() {
  ddp::InitOptions opts;
  opts.rank = 0;
  opts.world_size = 1;
  opts.store = std::make_shared<ddp::HashStore>();
  torch::nn::Linear net(4, 2);
  ddp::DistributedDataParallel model(net, ddp::init_process_group(opts));
  return 0;
}

struct Exit {
  int code = -1;  // -1: killed after the deadline
};

using ddp::test::wait_or_kill;

// Runs `world` workers (this binary with `worker_args`) and waits (at most 120 s, then kills
// them).
std::vector<Exit> run_worker_args(int world, const std::vector<std::string>& worker_args) {
  // Below the ephemeral range: a port found by binding port 0 and closed could be taken by an
  // outgoing connection before rank 0's store binds it ("address already in use").
  const int port = ddp::test::free_ports_below_ephemeral_range();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    for (std::string kv :
         {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
          "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port)}) {
      env.push_back(kv);
    }
    // Keep only the last definition of each variable (ours, over any inherited one).
    std::vector<std::string> unique;
    for (size_t i = 0; i < env.size(); ++i) {
      const std::string name = env[i].substr(0, env[i].find('=') + 1);
      bool overridden = false;
      for (size_t j = i + 1; j < env.size(); ++j) {
        if (env[j].rfind(name, 0) == 0) overridden = true;
      }
      if (!overridden) unique.push_back(env[i]);
    }
    std::vector<char*> envp;
    for (auto& s : unique) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = {"test_ddp_processes"};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()), 0);
    pids.push_back(pid);
  }
  std::vector<Exit> exits(world);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int r = 0; r < world; ++r) exits[r].code = wait_or_kill(pids[r], deadline);
  return exits;
}

std::vector<Exit> run_workers(int world, const std::string& dir, bool mismatch) {
  return run_worker_args(world, {"--worker", dir, mismatch ? "mismatch" : "train"});
}

fs::path temp_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

// Runs the BLAS probe with `extra_env` added; returns its exit code and its stderr.
std::pair<int, std::string> run_blas_probe(const std::vector<std::string>& extra_env) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    if (kv.rfind("LOCAL_RANK=", 0) != 0 && kv.rfind("LD_PRELOAD=", 0) != 0) env.push_back(kv);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  const fs::path log = temp_dir("ddp_blas_probe") / "stderr.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::string arg0 = "test_ddp_processes", arg1 = "--blas-probe";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return {-1, "posix_spawn failed"};
  const int code = wait_or_kill(pid, std::chrono::steady_clock::now() + std::chrono::seconds(60));
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  ddp::remove_tree(log.parent_path());
  return {code, text.str()};
}

// Debian's two BLAS builds, preloaded: libtorch's libblas.so.3 then binds to the preloaded one.
constexpr const char* kReferenceBlas = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
constexpr const char* kOpenBlas = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3";

TEST(DdpProcesses, ReferenceBlasIsNamedWithItsFixOnLocalRankZeroOnly) {
  for (const char* path : {kReferenceBlas, kOpenBlas}) {
    if (::access(path, R_OK) != 0) {
      GTEST_SKIP() << path << " is absent (not Debian x86_64, or scripts/install-deps.sh test "
                   << "did not run)";
    }
  }
  const std::string preload_reference = std::string("LD_PRELOAD=") + kReferenceBlas;
  auto [code, err] = run_blas_probe({preload_reference});
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(err.find("libblas.so.3 is the reference BLAS"), std::string::npos) << err;
  EXPECT_NE(err.find("apt-get install libopenblas0-openmp"), std::string::npos) << err;

  std::tie(code, err) = run_blas_probe({preload_reference, "LOCAL_RANK=1"});
  EXPECT_EQ(code, 0) << err;
  EXPECT_EQ(err.find("reference BLAS"), std::string::npos) << err;

  std::tie(code, err) = run_blas_probe({std::string("LD_PRELOAD=") + kOpenBlas});
  EXPECT_EQ(code, 0) << err;
  EXPECT_EQ(err.find("reference BLAS"), std::string::npos) << err;
}

TEST(DdpProcesses, TwoProcessesMatchOneProcessWithTheWholeBatch) {
  torch::set_num_threads(1);
  const int world = 2;
  auto dir = temp_dir("ddp_processes");
  auto exits = run_workers(world, dir.string(), false);
  for (int r = 0; r < world; ++r) ASSERT_EQ(exits[r].code, 0) << "rank " << r;

  std::vector<torch::Tensor> xs, ys;
  make_data(world, xs, ys);
  torch::manual_seed(100);  // rank 0's initial parameters
  ddp::test::Cnn ref;
  torch::optim::Adam opt(ref->parameters(), 1e-3);
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    torch::nll_loss(ref->forward(xs[s]), ys[s]).backward();
    opt.step();
  }
  for (int r = 0; r < world; ++r) {
    ddp::test::Cnn trained;
    torch::load(trained, (dir / ("rank" + std::to_string(r) + ".pt")).string());
    EXPECT_LT(ddp::test::max_relative_error(*trained, *ref), 1e-5) << "rank " << r;
  }
  ddp::remove_tree(dir);
}

// Uneven inputs across real processes (3, 2 and 1 steps): Join with DDP and ZeRO neither hangs
// nor desynchronizes; every rank ends with the same parameters (the Join tests in
// test_ddp_multirank compare the values with PyTorch's Join).
TEST(DdpProcesses, JoinWithZeroOnUnevenInputsEndsIdentical) {
  const int world = 3;
  auto dir = temp_dir("ddp_join");
  auto exits = run_worker_args(world, {"--worker", dir.string(), "join"});
  for (int r = 0; r < world; ++r) ASSERT_EQ(exits[r].code, 0) << "rank " << r;
  ddp::test::Cnn first;
  torch::load(first, (dir / "rank0.pt").string());
  for (int r = 1; r < world; ++r) {
    ddp::test::Cnn other;
    torch::load(other, (dir / ("rank" + std::to_string(r) + ".pt")).string());
    EXPECT_EQ(ddp::test::max_relative_error(*other, *first), 0.0) << "rank " << r;
  }
  ddp::remove_tree(dir);
}

TEST(DdpProcesses, MismatchedModelFailsEveryRank) {
  auto dir = temp_dir("ddp_mismatch");
  auto exits = run_workers(2, dir.string(), true);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(exits[r].code, 1) << "rank " << r;
  ddp::remove_tree(dir);
}

// Snapshot resume across real processes. Each rank's snapshot directory is its own (as on
// node-local disks) or shared.
class SnapshotResume : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_dir("ddp_resume"); }
  void TearDown() override { ddp::remove_tree(dir_); }

  // Saves a snapshot with `epochs_run` at path (a one-parameter model, `fill` everywhere).
  static void save(const std::string& path, int64_t epochs_run, float fill) {
    fs::create_directories(fs::path(path).parent_path());
    torch::nn::Linear lin(3, 1);
    {
      torch::NoGradGuard g;
      lin->weight.fill_(fill);
      lin->bias.fill_(fill);
    }
    ddp::SnapshotManager(ddp::SnapshotOptions(path))
        .save(ddp::capture_snapshot(*lin, nullptr, epochs_run, epochs_run));
  }
  // Runs 2 ranks resuming from `path` ("{rank}" per rank); their exit codes and results.
  std::vector<std::pair<int, std::string>> resume(const std::string& path) {
    auto exits = run_worker_args(2, {"--resume", path, dir_.string()});
    std::vector<std::pair<int, std::string>> out;
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(dir_ / ("rank" + std::to_string(r) + ".txt"));
      std::stringstream text;
      text << in.rdbuf();
      out.emplace_back(exits[r].code, text.str());
    }
    return out;
  }
  fs::path dir_;
};

// Node-local disks: node 0 has snapshots, node 1 none. Before, rank 0 resumed at epoch 3 and
// rank 1 started at epoch 0 with fresh optimizer state, silently; now both fail at once,
// naming the ranks and the fix.
TEST_F(SnapshotResume, RanksWithDifferentSnapshotsFailNamingThemAndTheFix) {
  save((dir_ / "node0/s.pt").string(), 3, 1.0f);
  fs::create_directories(dir_ / "node1");
  auto results = resume((dir_ / "node{rank}/s.pt").string());
  for (int r = 0; r < 2; ++r) {
    const auto& [code, text] = results[r];
    EXPECT_EQ(code, 1) << "rank " << r << ": " << text;
    EXPECT_NE(text.find("rank 0 has the snapshot at epoch 3"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 1 has no snapshot"), std::string::npos) << text;
    EXPECT_NE(text.find("a file system every node shares"), std::string::npos) << text;
    EXPECT_NE(text.find("copy the snapshot directory"), std::string::npos) << text;
    EXPECT_NE(text.find("from rank 0's node to every node"), std::string::npos) << text;
  }
}

// Same epoch, different bytes (copies that diverged): refused too.
TEST_F(SnapshotResume, SameEpochDifferentContentIsRefused) {
  save((dir_ / "node0/s.pt").string(), 2, 1.0f);
  save((dir_ / "node1/s.pt").string(), 2, 2.0f);
  auto results = resume((dir_ / "node{rank}/s.pt").string());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].first, 1) << results[r].second;
    EXPECT_NE(results[r].second.find("rank 0 has the snapshot at epoch 2 (sha256 "),
              std::string::npos)
        << results[r].second;
    EXPECT_NE(results[r].second.find("rank 1 has the snapshot at epoch 2 (sha256 "),
              std::string::npos)
        << results[r].second;
  }
}

// A shared directory, or copies of the same files: every rank resumes from the same snapshot.
TEST_F(SnapshotResume, SharedOrCopiedSnapshotsAgree) {
  save((dir_ / "shared/s.pt").string(), 4, 1.0f);
  auto results = resume((dir_ / "shared/s.pt").string());
  EXPECT_EQ(results[0].first, 0) << results[0].second;
  EXPECT_EQ(results[0].second.rfind("epoch 4 sha256 ", 0), 0u) << results[0].second;
  EXPECT_EQ(results[1], results[0]);

  fs::create_directories(dir_ / "node0");
  fs::create_directories(dir_ / "node1");
  for (const char* node : {"node0", "node1"}) {
    fs::copy(dir_ / "shared", dir_ / node, fs::copy_options::recursive);
  }
  results = resume((dir_ / "node{rank}/s.pt").string());
  EXPECT_EQ(results[0].first, 0) << results[0].second;
  EXPECT_EQ(results[0].second.rfind("epoch 4 sha256 ", 0), 0u) << results[0].second;
  EXPECT_EQ(results[1], results[0]);
}

TEST_F(SnapshotResume, NoSnapshotAnywhereStartsAfresh) {
  auto results = resume((dir_ / "node{rank}/s.pt").string());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].first, 0) << results[r].second;
    EXPECT_EQ(results[r].second, "none");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--blas-probe") return blas_probe_main();
  if (argc == 4 && std::string(argv[1]) == "--resume") return resume_main(argv[2], argv[3]);
  if (argc == 4 && std::string(argv[1]) == "--worker") {
    try {
      if (std::string(argv[3]) == "join") return join_worker_main(argv[2]);
      return worker_main(argv[2], std::string(argv[3]) == "mismatch");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "worker: %s\n", e.what());
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
