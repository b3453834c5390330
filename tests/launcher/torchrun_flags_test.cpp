// torchrun's flags beyond the core ones (issue 50): their parsing, the CPUs --numa-binding
// picks on a made-up machine, --virtual-local-rank's devices, the duplicate filters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli_test_support.hpp"
#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/output.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "ddp/launcher/worker_placement.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {
namespace {

using test::parse;
using test::usage_error;

TEST(TorchrunFlags, EachFlagAndItsPetVariable) {
  LaunchOptions o =
      parse({"--numa-binding", "exclusive", "--virtual-local-rank", "--run-path",
             "--duplicate-stdout-filters", "loss,,x,step", "--duplicate_stderr_filters", "Error",
             "--event-log-handler", "console", "p.py"});
  ASSERT_TRUE(o.placement.numa_binding.has_value());
  EXPECT_EQ(*o.placement.numa_binding, NumaBinding::kExclusive);
  EXPECT_TRUE(o.placement.virtual_local_rank);
  EXPECT_TRUE(o.run_path);
  EXPECT_EQ(o.duplicate_stdout_filters, (std::vector<std::string>{"loss,x", "step"}));
  EXPECT_EQ(o.duplicate_stderr_filters, (std::vector<std::string>{"Error"}));
  EXPECT_EQ(o.event_log_handler, "console");

  o = parse({"p.py"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"},
                       {"PET_RUN_PATH", "1"},
                       {"PET_DUPLICATE_STDOUT_FILTERS", "a,b"},
                       {"PET_EVENT_LOG_HANDLER", "dynamic_rendezvous"},
                       // torchrun reads no variable for --numa-binding or --logs-specs
                       {"PET_NUMA_BINDING", "node"},
                       {"PET_LOGS_SPECS", "custom"}});
  EXPECT_TRUE(o.placement.virtual_local_rank);
  EXPECT_TRUE(o.run_path);
  EXPECT_EQ(o.duplicate_stdout_filters, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o.event_log_handler, "dynamic_rendezvous");
  EXPECT_FALSE(o.placement.numa_binding.has_value());

  // Defaults.
  o = parse({"p.py"});
  EXPECT_FALSE(o.placement.numa_binding || o.placement.virtual_local_rank || o.run_path);
  EXPECT_TRUE(o.duplicate_stdout_filters.empty());
  EXPECT_EQ(o.event_log_handler, "null");
}

TEST(TorchrunFlags, AnEmptyFilterListIsOneFilterEveryLineHas) {
  // torchrun: comma_separated_list("") == [""].
  EXPECT_EQ(parse({"--duplicate-stdout-filters", "", "p.py"}).duplicate_stdout_filters,
            (std::vector<std::string>{""}));
}

TEST(TorchrunFlags, BadValuesNameTheFlagAndTheChoices) {
  EXPECT_NE(usage_error({"--numa-binding", "nodes", "p.py"}).find("node, socket, exclusive"),
            std::string::npos);
  EXPECT_NE(usage_error({"--event-log-handler", "file", "p.py"}).find("null, console"),
            std::string::npos);
  EXPECT_NE(usage_error({"p.py"}, {{"PET_EVENT_LOG_HANDLER", "x"}}).find("PET_EVENT_LOG_HANDLER"),
            std::string::npos);
  const std::string specs = usage_error({"--logs-specs", "mine", "p.py"});
  EXPECT_NE(specs.find("--logs-specs mine"), std::string::npos) << specs;
  EXPECT_NE(specs.find("torchrun.logs_specs"), std::string::npos) << specs;
}

TEST(TorchrunFlags, AnEmptyBooleanVariableIsOnAsPyTorchJobMeansIt) {
  // PyTorchJob's elastic policy sets PET_STANDALONE="" for standalone: true.
  EXPECT_TRUE(parse({"p.py"}, {{"PET_STANDALONE", ""}}).standalone);
  EXPECT_TRUE(parse({"p.py"}, {{"PET_VIRTUAL_LOCAL_RANK", ""}}).placement.virtual_local_rank);
  EXPECT_FALSE(parse({"p.py"}, {{"PET_STANDALONE", "0"}}).standalone);
}

TEST(TorchrunFlags, RunPathTakesPrecedenceOverModuleAndNoPython) {
  // torchrun: --run-path wins; -m with --no-python alone stays an error.
  EXPECT_TRUE(parse({"--run-path", "-m", "--no-python", "p.py"}).run_path);
  EXPECT_NE(usage_error({"-m", "--no-python", "p.py"}).find("cannot be used together"),
            std::string::npos);
}

TEST(VirtualLocalRank, EachWorkerSeesOnlyItsGpuAsDeviceZero) {
  EXPECT_EQ(virtual_visible_device(std::nullopt, 3), "3");
  EXPECT_EQ(virtual_visible_device(std::string("4, 6,7"), 1), "6");
  EXPECT_EQ(virtual_visible_device(std::string("GPU-abc,GPU-def"), 1), "GPU-def");
  EXPECT_THROW(virtual_visible_device(std::string("4"), 1), UsageError);

  WorldAssignment world;
  world.world_size = 2;
  world.local_world_size = 2;
  WorkerEnvInputs in;
  in.world = &world;
  in.worker.local_rank = 1;
  in.worker.global_rank = 1;
  in.virtual_local_rank = true;
  const auto env = build_worker_env({"CUDA_VISIBLE_DEVICES=5,9", "PATH=/bin"}, in);
  auto value = [&](const std::string& key) {
    std::string found = "<unset>";
    for (const auto& e : env) {
      if (e.rfind(key + "=", 0) == 0) found = e.substr(key.size() + 1);
    }
    return found;
  };
  EXPECT_EQ(value("LOCAL_RANK"), "0");
  EXPECT_EQ(value("CUDA_VISIBLE_DEVICES"), "9");
  EXPECT_EQ(value("RANK"), "1");
}

// A made-up sysfs: 2 sockets, each one NUMA node with 4 cores of 2 hyperthreads (CPUs c and
// c+16 are siblings), one L3 per 2 cores; GPUs 0,1 on node 0 and GPUs 2,3 on node 1.
class FakeMachine : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("ddp_topology_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    write("devices/system/node/node0/cpulist", "0-3,16-19");
    write("devices/system/node/node1/cpulist", "4-7,20-23");
    for (int c : cpus()) {
      const int core = c % 16;
      const std::string dir = "devices/system/cpu/cpu" + std::to_string(c);
      write(dir + "/topology/physical_package_id", std::to_string(core / 4));
      write(dir + "/topology/core_id", std::to_string(core % 4));
      write(dir + "/cache/index3/level", "3");
      const int first = core / 2 * 2;
      write(dir + "/cache/index3/shared_cpu_list",
            fmt_list({first, first + 1, first + 16, first + 17}));
    }
    const char* buses[] = {"0000:18:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"};
    for (int g = 0; g < 4; ++g) {
      const std::string dir = std::string("bus/pci/devices/") + buses[g];
      write(dir + "/vendor", "0x10de");
      write(dir + "/class", "0x030200");
      write(dir + "/numa_node", g < 2 ? "0" : "1");
    }
    write("bus/pci/devices/0000:00:1f.0/vendor", "0x8086");  // not a GPU
    write("bus/pci/devices/0000:00:1f.0/class", "0x060100");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  static std::vector<int> cpus() {
    std::vector<int> out;
    for (int c = 0; c < 8; ++c) out.push_back(c);
    for (int c = 16; c < 24; ++c) out.push_back(c);
    return out;
  }
  static std::string fmt_list(std::vector<int> v) {
    std::sort(v.begin(), v.end());
    return cpu_list_text(v);
  }
  void write(const std::string& rel, const std::string& text) {
    const auto path = root_ / rel;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }
  std::string bind(NumaBinding mode, int rank, int nproc, std::vector<int> allowed = cpus()) {
    return cpu_list_text(numa_cpus(mode, rank, nproc, read_cpu_topology(root_, allowed)));
  }

  std::filesystem::path root_;
};

TEST_F(FakeMachine, TopologyIsReadFromSysfs) {
  const CpuTopology t = read_cpu_topology(root_, cpus());
  ASSERT_EQ(t.cpus.size(), 16u);
  EXPECT_EQ(t.gpu_nodes, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(t.cpus[5].node, 1);  // CPU 5
  EXPECT_EQ(t.cpus[5].package, 1);
  EXPECT_EQ(t.cpus[1].core, t.cpus[9].core);  // CPUs 1 and 17: one core's hyperthreads
}

TEST_F(FakeMachine, NodeAndSocketBindToTheGpusNode) {
  EXPECT_EQ(bind(NumaBinding::kNode, 0, 4), "0-3,16-19");
  EXPECT_EQ(bind(NumaBinding::kNode, 3, 4), "4-7,20-23");
  EXPECT_EQ(bind(NumaBinding::kSocket, 2, 4), "4-7,20-23");
}

TEST_F(FakeMachine, ExclusiveSplitsTheNodesCoresAmongItsWorkers) {
  // Ranks 0, 1 share node 0's 4 cores: 2 each, hyperthreads together.
  EXPECT_EQ(bind(NumaBinding::kExclusive, 0, 4), "0-1,16-17");
  EXPECT_EQ(bind(NumaBinding::kExclusive, 1, 4), "2-3,18-19");
  EXPECT_EQ(bind(NumaBinding::kExclusive, 3, 4), "6-7,22-23");
}

TEST_F(FakeMachine, CoreComplexGivesEachWorkerItsOwnL3) {
  EXPECT_EQ(bind(NumaBinding::kCoreComplex, 0, 4), "0-1,16-17");
  EXPECT_EQ(bind(NumaBinding::kCoreComplex, 1, 4), "2-3,18-19");
  EXPECT_EQ(bind(NumaBinding::kCoreComplex, 2, 4), "4-5,20-21");
}

TEST_F(FakeMachine, OnlyAllowedCpusAndOnlyExistingGpus) {
  EXPECT_EQ(bind(NumaBinding::kNode, 0, 4, {0, 1, 4}), "0-1");
  EXPECT_THROW(bind(NumaBinding::kNode, 4, 5), UsageError);  // 5 workers, 4 GPUs
}

TEST(NumaBindingWithoutGpus, RanksFillTheNodesInBlocks) {
  CpuTopology t;
  for (int c = 0; c < 4; ++c) {
    CpuTopology::Cpu cpu;
    cpu.id = c;
    cpu.node = c / 2;
    cpu.core = std::to_string(c);
    t.cpus.push_back(cpu);
  }
  EXPECT_EQ(cpu_list_text(numa_cpus(NumaBinding::kNode, 0, 4, t)), "0-1");
  EXPECT_EQ(cpu_list_text(numa_cpus(NumaBinding::kNode, 1, 4, t)), "0-1");
  EXPECT_EQ(cpu_list_text(numa_cpus(NumaBinding::kNode, 2, 4, t)), "2-3");
  EXPECT_EQ(cpu_list_text(numa_cpus(NumaBinding::kExclusive, 3, 4, t)), "3");
  // Three workers on a node of two cores cannot each have one.
  EXPECT_THROW(numa_cpus(NumaBinding::kExclusive, 0, 6, t), UsageError);
}

TEST(DuplicateFilters, OnlyMatchingTeedLinesGoToTheFilteredFile) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  int console[2];
  ASSERT_EQ(::pipe(console), 0);
  {
    StreamRoute route;
    route.console_fd = console[1];
    route.prefix = "[default1]:";
    route.filtered_fd = p[1];
    route.filters = {"loss", "a,b"};
    StreamForwarder f(route);
    const std::string text = "step 1 loss 0.5\nnothing\nx a,b y\npartial loss";
    f.feed(text.data(), text.size());
    f.finish();
  }
  ::close(p[1]);
  ::close(console[1]);
  char buf[512];
  const ssize_t n = ::read(p[0], buf, sizeof(buf));
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, n),
            "[default1]:step 1 loss 0.5\n[default1]:x a,b y\n[default1]:partial loss\n");
  ::close(p[0]);
  ::close(console[0]);
}

}  // namespace
}  // namespace ddp::launcher
