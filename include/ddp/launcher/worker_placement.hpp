#pragma once
// Where each worker runs on its node: torchrun's --numa-binding and --virtual-local-rank.
//
// --numa-binding MODE binds each worker, and every thread it starts, to CPUs near the GPU its
// local rank uses (torch/numa/binding.py's modes), with sched_setaffinity before it starts:
//   node          every CPU of that GPU's NUMA node
//   socket        every CPU of the NUMA nodes on that node's socket
//   exclusive     the node's physical cores split evenly among the workers bound to that node
//                 (hyperthreads of a core stay together); fewer cores than workers is an error
//   core-complex  one group of cores sharing an L3 cache of that node, a different one per
//                 worker of the node while there are enough
// GPUs are the NVIDIA PCI devices in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID's order;
// CUDA_VISIBLE_DEVICES is not applied). A node without GPUs binds CPU workers instead: local
// ranks fill the NUMA nodes in equal blocks (ranks 0..k-1 on the first node, ...).
// Only CPUs ddprun itself may run on are used.
//
// --virtual-local-rank gives every worker LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES naming only
// its GPU: entry <local rank> of ddprun's CUDA_VISIBLE_DEVICES, or the local rank when that
// is unset (worker_env.cpp).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher {

enum class NumaBinding { kNode, kSocket, kExclusive, kCoreComplex };

// "node", "socket", "exclusive", "core-complex"; nullopt for anything else.
std::optional<NumaBinding> parse_numa_binding(std::string_view text);
const char* to_string(NumaBinding mode);

struct WorkerPlacement {
  std::optional<NumaBinding> numa_binding;
  bool virtual_local_rank = false;
};

// What the binding needs to know of the machine.
struct CpuTopology {
  struct Cpu {
    int id = 0;
    int node = 0;      // NUMA node
    int package = 0;   // socket
    std::string core;  // physical core: its hyperthreads share this key
    std::string l3;    // CPUs sharing its last-level cache (their list), "" unknown
  };
  std::vector<Cpu> cpus;       // the CPUs this process may run on, by id
  std::vector<int> gpu_nodes;  // the NUMA node of each NVIDIA GPU, in PCI bus order
};

// Reads the topology under `sysfs_root` ("/sys"; tests pass a tree of their own) for the CPUs
// in `allowed`. Missing files mean one node, one package, one core per CPU, no GPUs.
CpuTopology read_cpu_topology(const std::string& sysfs_root, const std::vector<int>& allowed);

// The CPUs this process may run on (sched_getaffinity).
std::vector<int> allowed_cpus();

// The CPUs worker `local_rank` of `nproc_per_node` binds to, ascending. Throws UsageError
// when the binding cannot be made (more workers than GPUs, exclusive with fewer cores than
// workers on a node).
std::vector<int> numa_cpus(NumaBinding mode, int local_rank, int nproc_per_node,
                           const CpuTopology& topology);

// "0-3,8" for {0,1,2,3,8}.
std::string cpu_list_text(const std::vector<int>& cpus);

}  // namespace ddp::launcher
