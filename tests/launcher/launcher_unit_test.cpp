// In-process tests of the launcher's pieces: command-line parsing, stream selectors, rank
// assignment, the worker environment, error files, reports and line forwarding.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include "cli_test_support.hpp"
#include "ddp/launcher/agent.hpp"
#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/error_file.hpp"
#include "ddp/launcher/multi_node.hpp"
#include "ddp/launcher/output.hpp"
#include "ddp/launcher/rendezvous_membership.hpp"
#include "ddp/launcher/root_cause.hpp"
#include "ddp/launcher/std_streams.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "ddp/launcher/world.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/rank_list.hpp"
#include "ddp/version.hpp"

namespace ddp::launcher {
namespace {

using test::fake_env;
using test::parse;
using test::usage_error;

// The UsageError message `f` throws, or "<no error>".
template <typename F>
std::string usage_error_of(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Cli, DefaultsMatchTorchrun) {
  LaunchOptions o = parse({"train", "--lr", "0.1"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.role, "default");
  EXPECT_EQ(o.run_id, "none");
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_FALSE(o.standalone);
  EXPECT_EQ(o.term_grace.count(), 30000);
  EXPECT_EQ(o.program, "train");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--lr", "0.1"}));
}

TEST(Cli, BothSpellingsOfEveryFlag) {
  for (const auto& [dash, underscore] :
       std::vector<std::pair<std::string, std::string>>{{"--nproc-per-node", "--nproc_per_node"},
                                                        {"--max-restarts", "--max_restarts"},
                                                        {"--master-port", "--master_port"},
                                                        {"--node-rank", "--node_rank"}}) {
    LaunchOptions a = parse({dash, "0" == dash ? "" : (dash == "--node-rank" ? "0" : "3"), "p"});
    LaunchOptions b = parse({underscore, dash == "--node-rank" ? "0" : "3", "p"});
    EXPECT_EQ(a.nproc_per_node, b.nproc_per_node) << dash;
    EXPECT_EQ(a.max_restarts, b.max_restarts) << dash;
    EXPECT_EQ(a.master_port, b.master_port) << dash;
  }
  LaunchOptions o =
      parse({"--log_dir", "/tmp/x", "--local_ranks_filter", "0,1", "--run_id", "r", "--master_addr",
             "10.0.0.1", "--no_python", "--monitor_interval", "0.5", "p"});
  EXPECT_EQ(o.log_dir.value_or(""), "/tmp/x");
  EXPECT_EQ(o.local_ranks_filter.value_or(std::vector<int>{}), (std::vector<int>{0, 1}));
  EXPECT_EQ(o.run_id, "r");
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_TRUE(o.no_python);
  EXPECT_DOUBLE_EQ(o.monitor_interval_s, 0.5);
}

TEST(Cli, PetVariablesAreFallbacks) {
  LaunchOptions o = parse({"p"}, {{"PET_NPROC_PER_NODE", "4"},
                                  {"PET_MAX_RESTARTS", "2"},
                                  {"PET_STANDALONE", "1"},
                                  {"PET_TEE", "3"},
                                  {"PET_RDZV_ID", "abc"},
                                  {"PET_MASTER_ADDR", "::1"}});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.tee.all, Std::kAll);
  EXPECT_EQ(o.run_id, "abc");
  EXPECT_EQ(o.master_addr, "::1");
  // The flag wins; an empty PET_ value counts as unset; PET_X=0 turns a switch off.
  o = parse({"--nproc-per-node", "2", "p"},
            {{"PET_NPROC_PER_NODE", "4"}, {"PET_ROLE", ""}, {"PET_STANDALONE", "0"}});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.role, "default");
  EXPECT_FALSE(o.standalone);
  EXPECT_NE(usage_error({"p"}, {{"PET_STANDALONE", "yes"}}).find("PET_STANDALONE=yes"),
            std::string::npos);
}

TEST(Cli, StandaloneGetsARandomRunId) {
  LaunchOptions a = parse({"--standalone", "p"});
  LaunchOptions b = parse({"--standalone", "p"});
  EXPECT_NE(a.run_id, "none");
  EXPECT_NE(a.run_id, b.run_id);
  EXPECT_EQ(parse({"--standalone", "--run-id", "mine", "p"}).run_id, "mine");
}

TEST(Cli, NprocKeywords) {
  int cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(parse({"--nproc-per-node", "cpu", "p"}).nproc_per_node, cpus);
  EXPECT_GE(parse({"--nproc-per-node", "auto", "p"}).nproc_per_node, 1);
  EXPECT_NE(usage_error({"--nproc-per-node", "many", "p"}).find("--nproc-per-node: 'many'"),
            std::string::npos);
}

// --nproc-per-node gpu|auto counts the NVIDIA devices CUDA_VISIBLE_DEVICES leaves visible, as
// torch.cuda.device_count() does: a SLURM job given 2 of a node's 8 GPUs starts 2 workers.
class GpuCount : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddp_fake_dev_XXXXXX";
    dev_ = ::mkdtemp(tmpl);
    for (std::string name : {"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidia4", "nvidia5",
                             "nvidia6", "nvidia7", "nvidiactl", "nvidia-uvm"}) {
      std::FILE* f = std::fopen((dev_ + "/" + name).c_str(), "w");
      ASSERT_NE(f, nullptr);
      std::fclose(f);
    }
  }
  void TearDown() override { std::system(("rm -rf " + dev_).c_str()); }
  int gpus(std::optional<std::string> cvd, const std::string& value = "gpu") {
    std::map<std::string, std::string> env;
    if (cvd) env["CUDA_VISIBLE_DEVICES"] = *cvd;
    return resolve_nproc_per_node(value, "--nproc-per-node", fake_env(env), dev_);
  }
  std::string dev_;
};

TEST_F(GpuCount, UnsetCountsEveryDevice) {
  EXPECT_EQ(gpus(std::nullopt), 8);
}

TEST_F(GpuCount, OrdinalListCountsItsEntries) {
  EXPECT_EQ(gpus("2,5"), 2);
  EXPECT_EQ(gpus("3"), 1);
  EXPECT_EQ(gpus(" 1 , 2 "), 2);
  EXPECT_EQ(gpus("1gpu2,2ampere"), 2);  // CUDA reads each entry like strtoul
  EXPECT_EQ(gpus("2,5", "auto"), 2);
}

TEST_F(GpuCount, InvalidOrNegativeEntryEndsTheList) {
  EXPECT_EQ(gpus("0,-1,1"), 1);
  EXPECT_EQ(gpus("0,x,1"), 1);
  EXPECT_EQ(gpus("6,7,8,1"), 2);  // ordinal 8 does not exist on 8 devices
}

TEST_F(GpuCount, DuplicateOrdinalHidesEverything) {
  EXPECT_NE(usage_error_of([&] { gpus("0,0"); }).find("CUDA_VISIBLE_DEVICES"), std::string::npos);
}

TEST_F(GpuCount, UuidsAndMigNamesCountAsEntries) {
  EXPECT_EQ(
      gpus("GPU-8a2f6c1e-0000-0000-0000-000000000001,GPU-8a2f6c1e-0000-0000-0000-000000000002"), 2);
  EXPECT_EQ(gpus("MIG-1b3c,MIG-2c4d,MIG-3d5e"), 3);
  EXPECT_EQ(gpus("GPU-a,GPU-b,2"), 2);  // anything without the prefix ends a UUID list
}

TEST_F(GpuCount, EmptyOrMinusOneHidesEveryGpu) {
  for (std::string cvd : {"", "-1"}) {
    const std::string why = usage_error_of([&] { gpus(cvd); });
    EXPECT_NE(why.find("CUDA_VISIBLE_DEVICES='" + cvd + "' hides every GPU"), std::string::npos)
        << why;
    EXPECT_NE(why.find("--nproc-per-node"), std::string::npos) << why;
    // auto falls back to one worker per CPU, like torchrun without a visible GPU.
    EXPECT_EQ(gpus(cvd, "auto"), static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  }
}

TEST(Cli, ErrorsNameTheFlagAndTheFix) {
  EXPECT_EQ(parse({"--nnodes", "2", "p"}).nnodes, 2);
  EXPECT_NE(usage_error({"--nnodes", "2:4", "p"}).find("needs --rdzv-backend c10d"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "0", "p"}).find("--nnodes 0: expected N or MIN:MAX"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rdzv-backend", "zookeeper", "p"}).find("unknown rendezvous backend"),
            std::string::npos);
  EXPECT_EQ(parse({"--rdzv-backend", "etcd-v2", "--nnodes", "1:3", "p"}).rdzv_backend, "etcd-v2");
  EXPECT_NE(usage_error({"--rdzv-endpoint", "a:2379,,b", "p"}).find("empty entry"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rdzv-conf", "join_timout=1", "p"}).find("unknown key 'join_timout'"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rdzv-endpoint", "h:x", "p"}).find("port 'x' is not a number"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "2", "--node-rank", "2", "p"})
                .find("give each node a distinct --node-rank from 0 to 1"),
            std::string::npos);
  EXPECT_NO_THROW(parse({"--nnodes", "1:1", "p"}));
  EXPECT_NE(usage_error({"--node-rank", "1", "p"}).find("--node-rank 1 is outside [0, 1)"),
            std::string::npos);
  EXPECT_NE(usage_error({"--standalon", "p"}).find("did you mean '--standalone'"),
            std::string::npos);
  EXPECT_NE(usage_error({"--run-id", "a/b", "p"}).find("cannot name a log folder"),
            std::string::npos);
  EXPECT_NE(usage_error({"--start-method", "thread", "p"}).find("spawn, fork, forkserver"),
            std::string::npos);
  EXPECT_NO_THROW(parse({"--start-method", "fork", "p"}));
  EXPECT_NE(usage_error({"--master-port", "", "p"}).find("--master-port"), std::string::npos);
}

TEST(FormatRankList, CollapsesRunsOfConsecutiveRanks) {
  EXPECT_EQ(format_rank_list({}), "");
  EXPECT_EQ(format_rank_list({0}), "0");
  EXPECT_EQ(format_rank_list({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(format_rank_list({0, 1, 4, 6, 7}), "0-1, 4, 6-7");
}

TEST(Cli, VersionPrintsTheProjectVersion) {
  ParsedCommandLine v = parse_command_line({"--version"}, fake_env({}));
  EXPECT_FALSE(v.options.has_value());
  EXPECT_EQ(v.help, std::string("ddprun (ddp) ") + DDP_VERSION_STRING + "\n");
}

TEST(Cli, DoubleDashAndHelp) {
  LaunchOptions o = parse({"--", "-weird-name", "x"});
  EXPECT_EQ(o.program, "-weird-name");
  ParsedCommandLine h = parse_command_line({"--help"}, fake_env({}));
  EXPECT_FALSE(h.options);
  EXPECT_NE(h.help.find("--nproc-per-node"), std::string::npos);
}

TEST(StdSpec, TorchrunSyntax) {
  EXPECT_EQ(parse_std_spec("0", "-r").all, Std::kNone);
  EXPECT_EQ(parse_std_spec("3", "-r").for_local_rank(5), Std::kAll);
  StdSpec m = parse_std_spec("0:1,1:2,3:3", "-t");
  EXPECT_EQ(m.for_local_rank(0), Std::kOut);
  EXPECT_EQ(m.for_local_rank(1), Std::kErr);
  EXPECT_EQ(m.for_local_rank(2), Std::kNone);
  EXPECT_EQ(m.for_local_rank(3), Std::kAll);
  for (const char* bad : {"", "4", "x", "0:", ":1", "0:1,", "0:1;1:2", "a:1", "12"}) {
    EXPECT_THROW(parse_std_spec(bad, "--tee"), UsageError) << bad;
  }
}

TEST(World, StaticAssignment) {
  StaticWorldOptions o;
  o.nnodes = 3;
  o.node_rank = 2;
  o.nproc_per_node = 4;
  o.master_addr = "h";
  o.master_port = 7;
  WorldAssignment w = assign_static_world(o);
  EXPECT_EQ(w.world_size, 12);
  EXPECT_EQ(w.group_rank, 2);
  EXPECT_EQ(w.group_world_size, 3);
  ASSERT_EQ(w.workers.size(), 4u);
  EXPECT_EQ(w.workers[1].global_rank, 9);
  EXPECT_EQ(w.workers[1].local_rank, 1);
  o.node_rank = 3;
  EXPECT_THROW(assign_static_world(o), UsageError);
}

TEST(WorkerEnv, OverridesInheritedValuesAndDropsAgentStore) {
  StaticWorldOptions o;
  o.nproc_per_node = 2;
  o.master_addr = "127.0.0.1";
  o.master_port = 1234;
  WorldAssignment w = assign_static_world(o);
  WorkerEnvInputs in;
  in.world = &w;
  in.worker = w.workers[1];
  in.role = "r";
  in.run_id = "id";
  in.restart_count = 2;
  in.max_restarts = 3;
  in.error_file = "/e.json";
  in.set_omp_threads = true;
  auto env =
      build_worker_env({"PATH=/bin", "RANK=99", "TORCHELASTIC_USE_AGENT_STORE=True", "X=a=b"}, in);
  std::map<std::string, std::string> m;
  for (const auto& e : env) m[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
  EXPECT_EQ(m["PATH"], "/bin");
  EXPECT_EQ(m["X"], "a=b");
  EXPECT_EQ(m["RANK"], "1");
  EXPECT_EQ(m["LOCAL_RANK"], "1");
  EXPECT_EQ(m["WORLD_SIZE"], "2");
  EXPECT_EQ(m["MASTER_PORT"], "1234");
  EXPECT_EQ(m["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(m["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(m["TORCHELASTIC_ERROR_FILE"], "/e.json");
  EXPECT_EQ(m["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(m.count("TORCHELASTIC_USE_AGENT_STORE"), 0u);
  EXPECT_EQ(env.size(), m.size()) << "no variable may appear twice";
}

TEST(ErrorFile, BothPytorchFormats) {
  auto nested = parse_error_file(
      R"({"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": "Traceback...", "timestamp": "1700000000"}}})",
      "f");
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->message, "ValueError: x");
  EXPECT_EQ(nested->traceback, "Traceback...");
  EXPECT_EQ(nested->timestamp.value_or(0), 1700000000);
  auto flat = parse_error_file(R"({"message": "boom", "timestamp": 12})", "f");
  ASSERT_TRUE(flat);
  EXPECT_EQ(flat->message, "boom");
  EXPECT_EQ(flat->timestamp.value_or(0), 12);
  EXPECT_FALSE(parse_error_file("  \n", "f"));
  auto broken = parse_error_file("{not json", "/x/error.json");
  ASSERT_TRUE(broken);
  EXPECT_NE(broken->message.find("/x/error.json"), std::string::npos);
  EXPECT_FALSE(read_error_file("/nonexistent/error.json"));
}

TEST(RootCause, ReportNamesEverything) {
  FailureReport r;
  r.role = "default";
  r.run_id = "run";
  r.restart_count = 1;
  r.max_restarts = 1;
  r.root_cause.global_rank = 3;
  r.root_cause.local_rank = 1;
  r.root_cause.pid = 42;
  r.root_cause.status = ExitStatus{true, SIGSEGV};
  r.root_cause.host = "node7";
  r.root_cause.time = std::chrono::system_clock::now();
  r.root_cause.stderr_tail = {"a", "b"};
  r.root_cause.error = ErrorFileMessage{"RuntimeError: z", "", std::nullopt};
  std::string text = format_failure_report(r);
  for (const char* s : {"rank:       3 (local rank 1)", "host:       node7", "signal 11 (SIGSEGV)",
                        "message:    RuntimeError: z", "    a\n    b\n", "1 of 1 restarts used"}) {
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
  }
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
  EXPECT_EQ(ExitStatus::from_wait_status(3 << 8).describe(), "exit code 3");
}

TEST(StreamForwarder, PrefixesWholeLinesAndKeepsATail) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  {
    StreamRoute route;
    route.console_fd = fds[1];
    route.prefix = "[default1]:";
    route.tail_lines = 2;
    StreamForwarder f(route);
    f.feed("one\ntw", 6);
    f.feed("o\nthree", 7);
    f.finish();
    EXPECT_EQ(std::vector<std::string>(f.tail().begin(), f.tail().end()),
              (std::vector<std::string>{"two", "three"}));
  }
  ::close(fds[1]);
  char buf[256];
  ssize_t n = ::read(fds[0], buf, sizeof(buf));
  ::close(fds[0]);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "[default1]:one\n[default1]:two\n[default1]:three\n");
}

// After the round the agent's watcher shares the agent's own store connection: nothing
// connects to the store after the round, so 1024 agents do not open 1024 more connections
// at once to a store host that may be starved of CPU (or of file descriptors).
TEST(RendezvousMembershipTest, WatchingOpensNoSecondConnection) {
  TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.token = "";
  TcpStoreServer server(so);
  server.start();
  TcpStoreOptions po;
  po.host = "127.0.0.1";
  po.port = server.port();
  po.token = "";
  TcpStore probe(po);

  RendezvousMembershipOptions mo;
  mo.rdzv.run_id = "watch";
  mo.rdzv.endpoint = {"127.0.0.1", server.port()};
  mo.rdzv.hostname = "host0";
  mo.rdzv.local_addr = "127.0.0.1";
  mo.rdzv.conf.heartbeat = std::chrono::milliseconds(100);
  mo.rdzv.pick_master_port = [] { return 40000; };
  mo.token = "";
  mo.notice_fd = -1;
  auto membership = make_rendezvous_membership(mo);
  MembershipRound round = membership->next_round();
  const size_t before = server.num_connections();  // the probe and the agent
  membership->start_watching();
  // The watcher's first heartbeat proves it is running (and any connection of its own was
  // accepted and counted before it could set a key).
  const std::string hb = "rdzv/watch/" + std::to_string(round.generation) + "/hb/0";
  for (int i = 0; i < 1000 && !(probe.check({hb}) && probe.get(hb) == "1"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(probe.get(hb), "1");
  EXPECT_EQ(server.num_connections(), before);
  membership->stop_watching();
  membership->finished();
  server.stop();
}

// MASTER_ADDR for a job that may span several nodes is never a loopback address unless every
// node is on this machine (the endpoint itself is loopback).
AddressFacts debian_node0(std::vector<cluster::NetInterface> extra = {}) {
  AddressFacts f;
  f.endpoint_host = "node0";  // resolves to 127.0.1.1 here, to 10.0.0.5 on the other nodes
  f.candidate = "127.0.1.1";
  f.candidate_is_loopback = true;
  f.max_nodes = 2;
  f.interfaces = {{"lo", true, true, {"127.0.0.1", "::1"}},
                  {"eth0", true, false, {"10.0.0.5", "fe80::1"}}};
  f.interfaces.insert(f.interfaces.end(), extra.begin(), extra.end());
  return f;
}

TEST(PublishableAddress, LoopbackIsReplacedByTheNodesOwnAddress) {
  EXPECT_EQ(publishable_address(debian_node0()), "10.0.0.5");
  // Down interfaces and IPv6 addresses beside one IPv4 address do not make it ambiguous.
  EXPECT_EQ(publishable_address(debian_node0(
                {{"eth1", false, false, {"10.9.0.5"}}, {"ib0", true, false, {"fd00::7"}}})),
            "10.0.0.5");
}

TEST(PublishableAddress, SeveralAddressesUseTheDefaultRouteOrRefuse) {
  AddressFacts f = debian_node0({{"ib0", true, false, {"10.1.0.5"}}});
  f.default_route_source = "10.1.0.5";
  EXPECT_EQ(publishable_address(f), "10.1.0.5");
  f.default_route_source = "";
  std::string why = usage_error_of([&] { publishable_address(f); });
  EXPECT_NE(why.find("MASTER_ADDR 127.0.1.1"), std::string::npos) << why;
  EXPECT_NE(why.find("may span 2 nodes"), std::string::npos) << why;
  EXPECT_NE(why.find("--local-addr"), std::string::npos) << why;
  EXPECT_NE(why.find("one of 10.0.0.5, 10.1.0.5"), std::string::npos) << why;
}

// A node whose only interface up is loopback cannot be reached by any other node: it keeps its
// candidate, and the rendezvous connect reports the unreachable endpoint (the real cause; the
// netns "diagnose" scenario pins that message for a node whose link is down).
TEST(PublishableAddress, NoOtherAddressLeavesTheDiagnosisToTheRendezvous) {
  AddressFacts f = debian_node0();
  f.interfaces.resize(1);  // loopback only
  EXPECT_EQ(publishable_address(f), "127.0.1.1");
  f.interfaces.push_back({"eth0", false, false, {"10.0.0.5"}});  // down
  EXPECT_EQ(publishable_address(f), "127.0.1.1");
}

TEST(PublishableAddress, LoopbackIsKeptWhenEveryNodeIsOnThisMachine) {
  AddressFacts f = debian_node0();
  f.max_nodes = 1;
  EXPECT_EQ(publishable_address(f), "127.0.1.1");
  f = debian_node0();
  for (std::string host : {"localhost", "127.0.0.1", "::1"}) {
    f.endpoint_host = host;
    EXPECT_EQ(publishable_address(f), "127.0.1.1") << host;
  }
  f = debian_node0();
  f.candidate = "10.0.0.5";
  f.candidate_is_loopback = false;
  EXPECT_EQ(publishable_address(f), "10.0.0.5");
}

// Static backend: the workers' MASTER_ADDR is the user's --master-addr.
TEST(RendezvousSettings, StaticUsesTheExplicitMasterAddr) {
  LaunchOptions o = parse({"--nnodes", "2", "--node-rank", "0", "--master-addr", "localhost",
                           "--master-port", "29511", "p"});
  RendezvousMembershipOptions m = rendezvous_settings(o, "node0");
  ASSERT_TRUE(m.master_addr.has_value());
  EXPECT_EQ(*m.master_addr, "localhost");
  EXPECT_EQ(m.rdzv.endpoint.host, "localhost");
  EXPECT_EQ(m.rdzv.endpoint.port, 29512);
  // c10d publishes the round creator's address: no override.
  o = parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "p"});
  EXPECT_FALSE(rendezvous_settings(o, "node0").master_addr.has_value());
}

// A scripted multi-node membership: hands out the given rounds in order (one node's view).
class ScriptedMembership : public Membership {
 public:
  struct Round {
    int generation;
    int nodes;
  };
  explicit ScriptedMembership(std::vector<Round> rounds) : rounds_(std::move(rounds)) {}
  MembershipRound next_round() override {
    if (next_ >= rounds_.size()) throw Error("scripted membership: no more rounds");
    const Round r = rounds_[next_++];
    MembershipRound out;
    out.generation = r.generation;
    out.summary = "round " + std::to_string(r.generation);
    WorldAssignment& w = out.world;
    w.group_rank = r.nodes - 1;  // this node joined last
    w.group_world_size = r.nodes;
    w.local_world_size = 1;
    w.world_size = w.role_world_size = r.nodes;
    w.master_addr = "127.0.0.1";
    w.master_port = 29500;
    WorkerIdentity id;
    id.local_rank = 0;
    id.global_rank = id.role_rank = r.nodes - 1;
    w.workers.push_back(id);
    return out;
  }
  int start_watching() override {
    if (::pipe(pipe_) != 0) throw Error("pipe");
    return pipe_[0];
  }
  std::optional<std::string> stop_watching() override {
    ::close(pipe_[0]);
    ::close(pipe_[1]);
    return std::nullopt;
  }
  // The round's reason: `other_reason` (another node ended the round first) when set.
  std::string end_round(const std::string& reason) override {
    return other_reason.empty() ? reason : other_reason;
  }
  std::string other_reason;
  void finished() override {}
  void leave(const std::string&) override {}
  void shut_down(const std::string&) override {}

 private:
  std::vector<Round> rounds_;
  size_t next_ = 0;
  int pipe_[2] = {-1, -1};
};

// The worker's TORCHELASTIC_RESTART_COUNT in each attempt, for a worker that fails (exit 3)
// in its first `failures` attempts and then succeeds.
std::string restart_counts(std::vector<ScriptedMembership::Round> rounds, int failures,
                           int max_restarts, const std::string& other_reason = "") {
  char tmpl[] = "/tmp/ddp_restart_count_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  ScriptedMembership m(std::move(rounds));
  m.other_reason = other_reason;
  AgentOptions o;
  o.max_restarts = max_restarts;
  o.membership = &m;
  o.host = "testhost";
  o.term_grace = std::chrono::milliseconds(2000);
  o.monitor_interval = std::chrono::milliseconds(20);
  o.notice_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  o.command = {"/bin/sh", "-c",
               "echo \"$TORCHELASTIC_RESTART_COUNT\" >> " + dir + "/counts; n=$(wc -l < " + dir +
                   "/counts); [ \"$n\" -gt " + std::to_string(failures) + " ] || exit 3"};
  o.base_env = {"PATH=/usr/bin:/bin"};
  const AgentResult r = run_agent(o);
  ::close(o.notice_fd);
  std::string counts;
  if (std::FILE* f = std::fopen((dir + "/counts").c_str(), "r")) {
    char line[64];
    while (std::fgets(line, sizeof line, f)) counts += line;
    std::fclose(f);
  }
  std::system(("rm -rf " + dir).c_str());
  EXPECT_EQ(r.exit_code, 0) << counts;
  return counts;
}

// torchrun's TORCHELASTIC_RESTART_COUNT counts this agent's restarts after a failure of its
// workers, not the rendezvous generation: a node joining a running job (generation 3) starts
// its workers with 0, like every node's first attempt.
TEST(AgentRestartCount, LateJoinerStartsAtZero) {
  EXPECT_EQ(restart_counts({{3, 2}}, 0, 0), "0\n");
}

TEST(AgentRestartCount, CountsFailureRestartsNotGenerations) {
  EXPECT_EQ(restart_counts({{5, 2}, {7, 2}, {8, 2}}, 2, 3), "0\n1\n2\n");
}

// A round with fewer nodes after a failure is not charged to --max-restarts (ddprun's rule),
// but the workers still see a restart after a failure.
TEST(AgentRestartCount, NodeLossRestartIsStillARestartForTheWorkers) {
  EXPECT_EQ(restart_counts({{2, 3}, {4, 2}}, 1, 0), "0\n1\n");
}

// Another node ended the round before this node's workers failed: their failure is taken for a
// consequence (they lost their peers), as when the round ends first, so it is not this node's
// failure: no restart charged (max_restarts 0 still lets the job go on), and the workers see
// no restart. Before, this node counted it as its own failure and, out of restarts, ended the
// job naming its own rank.
TEST(AgentRestartCount, AFailureAfterAnotherNodeEndedTheRoundIsNotThisNodesOwn) {
  EXPECT_EQ(restart_counts({{0, 2}, {1, 2}}, 1, 0, "rank 3 failed: exit code 7 on node1"),
            "0\n0\n");
}

}  // namespace
}  // namespace ddp::launcher
