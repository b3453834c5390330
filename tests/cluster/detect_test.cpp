// Cluster detection from the variables SLURM, PBS and OpenMPI set (values as those systems
// write them), explicit values winning, and the errors for inconsistent environments.
#include "ddp/cluster/detect.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>

#include "ddp/util/error.hpp"

namespace ddp::cluster {
namespace {

// What `srun` sets in a task of a 4-node job with one task per node, on the third node.
EnvMap slurm_srun_task() {
  return {{"SLURM_JOB_ID", "1234"},
          {"SLURM_JOBID", "1234"},
          {"SLURM_JOB_NODELIST", "gpu[001-004]"},
          {"SLURM_NODELIST", "gpu[001-004]"},
          {"SLURM_JOB_NUM_NODES", "4"},
          {"SLURM_NNODES", "4"},
          {"SLURM_STEP_NODELIST", "gpu[001-004]"},
          {"SLURM_STEP_NUM_NODES", "4"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x4)"},
          {"SLURM_NODEID", "2"},
          {"SLURM_PROCID", "2"},
          {"SLURM_LOCALID", "0"},
          {"SLURMD_NODENAME", "gpu003"},
          {"SLURM_GPUS_ON_NODE", "4"}};
}

DetectOptions on_host(const std::string& host) {
  DetectOptions o;
  o.hostname = host;
  return o;
}

TEST(DetectNone, NothingSetMeansSingleNode) {
  ClusterInfo info = detect_cluster(EnvMap{{"HOME", "/root"}}, on_host("box"));
  EXPECT_EQ(info.source, "none");
  EXPECT_FALSE(info.detected());
  EXPECT_EQ(info.nnodes, 1);
  EXPECT_EQ(info.node_rank, 0);
  EXPECT_EQ(info.origin.nnodes, Origin::kDefault);
  EXPECT_NE(info.explanation.find("no cluster detected"), std::string::npos);
}

TEST(DetectSlurm, SrunTaskOnThirdNode) {
  ClusterInfo info = detect_cluster(slurm_srun_task(), on_host("gpu003"));
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.nnodes, 4);
  EXPECT_EQ(info.node_rank, 2);
  EXPECT_EQ(info.master_addr, "gpu001");
  EXPECT_EQ(info.run_id, "1234");
  ASSERT_TRUE(info.nproc_per_node.has_value());
  EXPECT_EQ(*info.nproc_per_node, 4);
  EXPECT_EQ(info.nproc_reason, "SLURM_GPUS_ON_NODE=4");
  EXPECT_EQ(info.hosts, (std::vector<std::string>{"gpu001", "gpu002", "gpu003", "gpu004"}));
  EXPECT_EQ(info.origin.node_rank, Origin::kDetected);
  EXPECT_EQ(info.origin.master_addr, Origin::kDetected);
  EXPECT_TRUE(info.warnings.empty());
  EXPECT_EQ(info.explanation,
            "using SLURM: job 1234, 4 nodes gpu[001-004], this is node 2 (gpu003), master "
            "gpu001, 4 processes per node (SLURM_GPUS_ON_NODE=4)");
}

TEST(DetectSlurm, StepNodeListWinsOverTheJobs) {
  // srun -N2 inside a 4-node job: SLURM_NODEID counts the step's nodes.
  EnvMap env = slurm_srun_task();
  env["SLURM_STEP_NODELIST"] = "gpu[003-004]";
  env["SLURM_STEP_NUM_NODES"] = "2";
  env["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  env["SLURM_NODEID"] = "0";
  ClusterInfo info = detect_cluster(env, on_host("gpu003"));
  EXPECT_EQ(info.nnodes, 2);
  EXPECT_EQ(info.node_rank, 0);
  EXPECT_EQ(info.master_addr, "gpu003");
}

TEST(DetectSlurm, BatchScriptFindsThisNodeByName) {
  EnvMap env{{"SLURM_JOB_ID", "77"},
             {"SLURM_JOB_NODELIST", "cn[10-11],login5"},
             {"SLURM_JOB_NUM_NODES", "3"},
             {"SLURMD_NODENAME", "cn11"},
             {"SLURM_NTASKS_PER_NODE", "2"}};
  ClusterInfo info = detect_cluster(env, on_host("ignored"));
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.nnodes, 3);
  EXPECT_EQ(info.nproc_per_node.value_or(-1), 2);
  EXPECT_EQ(info.nproc_reason, "SLURM_NTASKS_PER_NODE=2");
}

TEST(DetectSlurm, GpusPerNodeWithType) {
  EnvMap env = slurm_srun_task();
  env.erase("SLURM_GPUS_ON_NODE");
  env["SLURM_GPUS_PER_NODE"] = "a100:8";
  EXPECT_EQ(detect_cluster(env, on_host("gpu003")).nproc_per_node.value_or(-1), 8);
}

TEST(DetectSlurm, SeveralSrunTasksPerNodeWarn) {
  EnvMap env = slurm_srun_task();
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(x4)";
  env["SLURM_NTASKS_PER_NODE"] = "2";
  env.erase("SLURM_GPUS_ON_NODE");
  ClusterInfo info = detect_cluster(env, on_host("gpu003"));
  ASSERT_EQ(info.warnings.size(), 1u);
  EXPECT_NE(info.warnings[0].find("srun --ntasks-per-node=1"), std::string::npos);
  // Two ddprun agents on one node each starting SLURM_NTASKS_PER_NODE workers would double
  // up: no hint then.
  EXPECT_FALSE(info.nproc_per_node.has_value());
}

TEST(DetectSlurm, NodeIdPastTheListIsAnError) {
  EnvMap env = slurm_srun_task();
  env["SLURM_NODEID"] = "4";
  try {
    detect_cluster(env, on_host("gpu003"));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_NODEID=4 is not below the 4 nodes"),
              std::string::npos)
        << e.what();
  }
}

TEST(DetectSlurm, OutsideTheAllocationNeedsNodeRank) {
  // salloc's shell on a login node: job variables, but this host is not in the list.
  EnvMap env{{"SLURM_JOB_ID", "5"}, {"SLURM_JOB_NODELIST", "n[1-2]"}};
  try {
    detect_cluster(env, on_host("login1"));
    FAIL();
  } catch (const UsageError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("this host (login1) is not in SLURM_JOB_NODELIST=n[1-2]"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("--node-rank"), std::string::npos) << msg;
  }
  DetectOptions o = on_host("login1");
  o.overrides.node_rank = 1;
  ClusterInfo info = detect_cluster(env, o);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.origin.node_rank, Origin::kExplicit);
}

TEST(DetectSlurm, BadNodeListNamesTheList) {
  EnvMap env{{"SLURM_JOB_ID", "5"}, {"SLURM_JOB_NODELIST", "n[2-1]"}, {"SLURM_NODEID", "0"}};
  EXPECT_THROW(detect_cluster(env, on_host("n1")), UsageError);
}

TEST(DetectExplicit, ExplicitValuesWinAndAreMarked) {
  DetectOptions o = on_host("gpu003");
  o.overrides.nnodes = 2;
  o.overrides.node_rank = 1;
  o.overrides.master_addr = "10.1.2.3";
  o.overrides.nproc_per_node = 1;
  ClusterInfo info = detect_cluster(slurm_srun_task(), o);
  EXPECT_EQ(info.nnodes, 2);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.master_addr, "10.1.2.3");
  EXPECT_EQ(info.nproc_per_node.value_or(-1), 1);
  EXPECT_EQ(info.run_id, "1234");  // not overridden: still detected
  EXPECT_EQ(info.origin.nnodes, Origin::kExplicit);
  EXPECT_EQ(info.origin.run_id, Origin::kDetected);
  EXPECT_NE(info.explanation.find("explicit: --nnodes 2 (detected 4), --node-rank 1 (detected "
                                  "2), --master-addr 10.1.2.3 (detected gpu001)"),
            std::string::npos)
      << info.explanation;
}

TEST(DetectExplicit, NodeRankMustBeBelowNodeCount) {
  DetectOptions o = on_host("box");
  o.overrides.node_rank = 3;
  o.overrides.nnodes = 2;
  EXPECT_THROW(detect_cluster(EnvMap{}, o), UsageError);
}

TEST(DetectExplicit, SchedulerNoneIgnoresTheEnvironment) {
  DetectOptions o = on_host("gpu003");
  o.scheduler = "none";
  EXPECT_EQ(detect_cluster(slurm_srun_task(), o).source, "none");
  o.scheduler = "pbs";
  EXPECT_THROW(detect_cluster(slurm_srun_task(), o), UsageError);
  o.scheduler = "lsf";
  EXPECT_THROW(detect_cluster(slurm_srun_task(), o), UsageError);
}

// A PBS_NODEFILE as PBS Pro writes it for select=3:ncpus=2:mpiprocs=2 (one line per slot).
class DetectPbs : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/ddp-pbs-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    nodefile_ = dir_ + "/nodefile";
    std::ofstream(nodefile_) << "r1i0n5.ib0.cluster\nr1i0n5.ib0.cluster\nr1i0n7.ib0.cluster\n"
                                "r1i0n7.ib0.cluster\nr1i0n2.ib0.cluster\nr1i0n2.ib0.cluster\n";
  }
  void TearDown() override {
    unlink(nodefile_.c_str());
    rmdir(dir_.c_str());
  }
  EnvMap env() const { return {{"PBS_JOBID", "4242.pbs01"}, {"PBS_NODEFILE", nodefile_}}; }
  std::string dir_, nodefile_;
};

TEST_F(DetectPbs, UniqueHostsInOrderAndThisNodeByShortName) {
  ClusterInfo info = detect_cluster(env(), on_host("r1i0n7"));
  EXPECT_EQ(info.source, "pbs");
  EXPECT_EQ(info.nnodes, 3);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.master_addr, "r1i0n5.ib0.cluster");
  EXPECT_EQ(info.run_id, "4242.pbs01");
  EXPECT_EQ(info.nproc_per_node.value_or(-1), 2);
  EXPECT_EQ(info.explanation,
            "using PBS: job 4242.pbs01, 3 nodes r1i0n5.ib0.cluster,r1i0n7.ib0.cluster,"
            "r1i0n2.ib0.cluster, this is node 1 (r1i0n7.ib0.cluster), master "
            "r1i0n5.ib0.cluster, 2 processes per node (PBS_NODEFILE lists this host 2 times)");
}

TEST_F(DetectPbs, HostNotInNodefileIsAnError) {
  try {
    detect_cluster(env(), on_host("login2"));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("this host (login2) is not in PBS_NODEFILE="),
              std::string::npos)
        << e.what();
  }
}

TEST_F(DetectPbs, MissingNodefileIsAnError) {
  EnvMap e = env();
  e["PBS_NODEFILE"] = dir_ + "/absent";
  try {
    detect_cluster(e, on_host("r1i0n7"));
    FAIL();
  } catch (const UsageError& err) {
    EXPECT_NE(std::string(err.what()).find("cannot read PBS_NODEFILE=" + dir_ + "/absent"),
              std::string::npos)
        << err.what();
  }
}

TEST(DetectOpenMpi, OneProcessPerNode) {
  EnvMap env{{"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_RANK", "3"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
             {"OMPI_COMM_WORLD_NODE_RANK", "0"},
             {"OMPI_MCA_ess_base_jobid", "1234501633"},
             {"MASTER_ADDR", "node0"}};
  ClusterInfo info = detect_cluster(env, on_host("node3"));
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.nnodes, 4);
  EXPECT_EQ(info.node_rank, 3);
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.run_id, "1234501633");
  EXPECT_TRUE(info.warnings.empty());
}

TEST(DetectOpenMpi, WithoutMasterAddrSaysHowToGiveIt) {
  EnvMap env{{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}};
  ClusterInfo info = detect_cluster(env, on_host("node0"));
  EXPECT_TRUE(info.master_addr.empty());
  EXPECT_EQ(info.origin.master_addr, Origin::kDefault);
  EXPECT_NE(info.explanation.find("master unknown (pass --master-addr or set MASTER_ADDR)"),
            std::string::npos)
      << info.explanation;
}

TEST(DetectOpenMpi, SeveralPerNodeWarnsAndCountsBlocks) {
  EnvMap env{{"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_RANK", "3"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  ClusterInfo info = detect_cluster(env, on_host("n"));
  EXPECT_EQ(info.nnodes, 2);
  EXPECT_EQ(info.node_rank, 1);
  ASSERT_EQ(info.warnings.size(), 1u);
  EXPECT_NE(info.warnings[0].find("--map-by ppr:1:node"), std::string::npos);
}

TEST(DetectOpenMpi, WinsOverSlurmWhenMpirunRunsInsideAJob) {
  EnvMap env = slurm_srun_task();
  env["OMPI_COMM_WORLD_SIZE"] = "2";
  env["OMPI_COMM_WORLD_RANK"] = "1";
  EXPECT_EQ(detect_cluster(env, on_host("gpu003")).source, "openmpi");
}

TEST(DetectOpenMpi, GarbageIsAnErrorNamingTheVariable) {
  EnvMap env{{"OMPI_COMM_WORLD_SIZE", "two"}, {"OMPI_COMM_WORLD_RANK", "0"}};
  try {
    detect_cluster(env, on_host("n"));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_SIZE=two"), std::string::npos);
  }
}

TEST(DetectEnvironment, ReadsTheRealEnvironment) {
  ASSERT_EQ(setenv("DDP_DETECT_TEST_PROBE", "x", 1), 0);
  EXPECT_EQ(lookup(current_environment(), "DDP_DETECT_TEST_PROBE").value_or(""), "x");
  unsetenv("DDP_DETECT_TEST_PROBE");
}

// What Kubeflow's PyTorchJob (training-operator v1.9, pkg/controller.v1/pytorch/envvar.go)
// sets in worker pod 1 of a job "mnist" with a master and two workers, nprocPerNode 2.
EnvMap pytorchjob_worker_pod() {
  return {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
          {"PYTHONUNBUFFERED", "1"},
          {"MASTER_PORT", "23456"},
          {"MASTER_ADDR", "mnist-master-0"},
          {"WORLD_SIZE", "6"},  // replicas x nprocPerNode: processes, not pods
          {"RANK", "2"},
          {"PET_NODE_RANK", "2"},
          {"PET_NPROC_PER_NODE", "2"},
          {"PET_NNODES", "3"}};
}

TEST(DetectKubernetes, VolcanoPodIsANodeOfWorldSizePods) {
  // Volcano's pytorch plugin: WORLD_SIZE pods, RANK the pod's index.
  EnvMap env{{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
             {"MASTER_ADDR", "job-master-0.job"},
             {"MASTER_PORT", "23456"},
             {"WORLD_SIZE", "3"},
             {"RANK", "1"}};
  ClusterInfo info = detect_cluster(env, on_host("job-worker-0"));
  EXPECT_EQ(info.source, "kubernetes");
  EXPECT_EQ(info.nnodes, 3);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.master_addr, "job-master-0.job");
  EXPECT_EQ(info.master_port.value_or(0), 23456);
  EXPECT_NE(info.explanation.find("using Kubernetes: 3 nodes, this is node 1, master "
                                  "job-master-0.job:23456"),
            std::string::npos)
      << info.explanation;
}

TEST(DetectKubernetes, PyTorchJobsPetValuesWinOverItsProcessCount) {
  // ddprun reads PET_NNODES and PET_NODE_RANK as flags: they reach detection as overrides.
  DetectOptions options = on_host("mnist-worker-1");
  options.overrides.nnodes = 3;
  options.overrides.node_rank = 2;
  ClusterInfo info = detect_cluster(pytorchjob_worker_pod(), options);
  EXPECT_EQ(info.source, "kubernetes");
  EXPECT_EQ(info.nnodes, 3);
  EXPECT_EQ(info.node_rank, 2);
  EXPECT_EQ(info.master_addr, "mnist-master-0");
  EXPECT_EQ(info.master_port.value_or(0), 23456);
}

TEST(DetectKubernetes, NeedsThePodMarkerMasterAndRank) {
  EnvMap env = pytorchjob_worker_pod();
  env.erase("KUBERNETES_SERVICE_HOST");  // not a pod: RANK/MASTER_ADDR mean something else
  EXPECT_EQ(detect_cluster(env, on_host("h")).source, "none");
  env = pytorchjob_worker_pod();
  env.erase("RANK");
  EXPECT_EQ(detect_cluster(env, on_host("h")).source, "none");
  env = pytorchjob_worker_pod();
  env["MASTER_PORT"] = "70000";
  EXPECT_THROW(detect_cluster(env, on_host("h")), UsageError);
}

}  // namespace
}  // namespace ddp::cluster
