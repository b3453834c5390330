// --numa-binding: the machine's CPU topology from sysfs and the CPUs each worker binds to
// (worker_placement.hpp).
#include "ddp/launcher/worker_placement.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "ddp/util/error.hpp"
#include "ddp/util/rank_list.hpp"

namespace ddp::launcher {

namespace {

// The first line of a small sysfs file; nullopt when it cannot be read.
std::optional<std::string> read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<int> read_int(const std::string& path) {
  auto line = read_line(path);
  if (!line) return std::nullopt;
  try {
    return std::stoi(*line, nullptr, 0);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "0-3,8" -> {0,1,2,3,8}; malformed pieces are skipped.
std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    try {
      const size_t dash = item.find('-');
      const int lo = std::stoi(item.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(item.substr(dash + 1));
      for (int c = lo; c <= hi && c - lo < 65536; ++c) out.push_back(c);
    } catch (const std::exception&) {
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// The NUMA node of each worker: of GPU `local_rank` when the machine has GPUs, else the nodes
// in equal blocks of local ranks.
int worker_node(int local_rank, int nproc, const CpuTopology& t, const std::vector<int>& nodes) {
  if (!t.gpu_nodes.empty()) {
    if (local_rank >= static_cast<int>(t.gpu_nodes.size())) {
      throw UsageError(fmt::format(
          "--numa-binding: local rank {} has no GPU (this node has {}); run at most {} workers "
          "per node with --numa-binding",
          local_rank, t.gpu_nodes.size(), t.gpu_nodes.size()));
    }
    const int node = t.gpu_nodes[local_rank];
    // A GPU whose node has no CPU this process may use (or an unknown node: -1) binds to the
    // first node that has one.
    return std::count(nodes.begin(), nodes.end(), node) > 0 ? node : nodes.front();
  }
  return nodes[static_cast<size_t>(local_rank) * nodes.size() / static_cast<size_t>(nproc)];
}

}  // namespace

std::optional<NumaBinding> parse_numa_binding(std::string_view text) {
  if (text == "node") return NumaBinding::kNode;
  if (text == "socket") return NumaBinding::kSocket;
  if (text == "exclusive") return NumaBinding::kExclusive;
  if (text == "core-complex") return NumaBinding::kCoreComplex;
  return std::nullopt;
}

const char* to_string(NumaBinding mode) {
  switch (mode) {
    case NumaBinding::kNode:
      return "node";
    case NumaBinding::kSocket:
      return "socket";
    case NumaBinding::kExclusive:
      return "exclusive";
    case NumaBinding::kCoreComplex:
      return "core-complex";
  }
  return "?";
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

CpuTopology read_cpu_topology(const std::string& sysfs_root, const std::vector<int>& allowed) {
  namespace fs = std::filesystem;
  CpuTopology t;
  std::map<int, int> node_of;  // cpu -> node
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(sysfs_root + "/devices/system/node", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 ||
        name.find_first_not_of("0123456789", 4) != std::string::npos) {
      continue;
    }
    const int node = std::stoi(name.substr(4));
    if (auto list = read_line(e.path().string() + "/cpulist")) {
      for (int c : parse_cpu_list(*list)) node_of[c] = node;
    }
  }
  for (int c : allowed) {
    const std::string dir = fmt::format("{}/devices/system/cpu/cpu{}", sysfs_root, c);
    CpuTopology::Cpu cpu;
    cpu.id = c;
    cpu.node = node_of.count(c) ? node_of[c] : 0;
    cpu.package = read_int(dir + "/topology/physical_package_id").value_or(0);
    cpu.core = fmt::format("{}:{}", cpu.package, read_int(dir + "/topology/core_id").value_or(c));
    // The last-level cache: the highest cache index of level 3, else none known.
    for (int index = 0; index < 8; ++index) {
      const std::string cache = fmt::format("{}/cache/index{}", dir, index);
      if (read_int(cache + "/level").value_or(0) == 3) {
        cpu.l3 = read_line(cache + "/shared_cpu_list").value_or("");
      }
    }
    t.cpus.push_back(std::move(cpu));
  }
  // NVIDIA GPUs (vendor 0x10de; display class 0x03xxxx), in PCI bus order.
  std::vector<std::string> gpus;
  for (const auto& e : fs::directory_iterator(sysfs_root + "/bus/pci/devices", ec)) {
    const std::string dir = e.path().string();
    if (read_int(dir + "/vendor").value_or(0) != 0x10de) continue;
    if ((read_int(dir + "/class").value_or(0) >> 16) != 0x03) continue;
    gpus.push_back(dir);
  }
  std::sort(gpus.begin(), gpus.end());
  for (const auto& dir : gpus) t.gpu_nodes.push_back(read_int(dir + "/numa_node").value_or(-1));
  return t;
}

std::vector<int> numa_cpus(NumaBinding mode, int local_rank, int nproc_per_node,
                           const CpuTopology& t) {
  if (t.cpus.empty()) throw UsageError("--numa-binding: this process may run on no CPU");
  std::vector<int> nodes;
  for (const auto& c : t.cpus) nodes.push_back(c.node);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());

  const int node = worker_node(local_rank, nproc_per_node, t, nodes);
  std::vector<const CpuTopology::Cpu*> on_node;
  for (const auto& c : t.cpus) {
    if (c.node == node) on_node.push_back(&c);
  }
  // The workers bound to the same node, in local-rank order, and this one's place among them.
  int peers = 0, place = 0;
  for (int r = 0; r < nproc_per_node; ++r) {
    if (worker_node(r, nproc_per_node, t, nodes) != node) continue;
    if (r == local_rank) place = peers;
    ++peers;
  }

  std::vector<int> out;
  switch (mode) {
    case NumaBinding::kNode:
      for (const auto* c : on_node) out.push_back(c->id);
      break;
    case NumaBinding::kSocket: {
      std::set<int> packages;
      for (const auto* c : on_node) packages.insert(c->package);
      std::set<int> socket_nodes;
      for (const auto& c : t.cpus) {
        if (packages.count(c.package)) socket_nodes.insert(c.node);
      }
      for (const auto& c : t.cpus) {
        if (socket_nodes.count(c.node)) out.push_back(c.id);
      }
      break;
    }
    case NumaBinding::kExclusive: {
      std::vector<std::string> cores;  // in CPU order
      for (const auto* c : on_node) {
        if (std::find(cores.begin(), cores.end(), c->core) == cores.end()) cores.push_back(c->core);
      }
      if (static_cast<int>(cores.size()) < peers) {
        throw UsageError(fmt::format(
            "--numa-binding exclusive: NUMA node {} has {} physical core(s) for {} workers; use "
            "--numa-binding node (shared cores) or fewer workers per node",
            node, cores.size(), peers));
      }
      const size_t per = cores.size() / static_cast<size_t>(peers);
      const std::vector<std::string> mine(cores.begin() + place * per,
                                          cores.begin() + (place + 1) * per);
      for (const auto* c : on_node) {
        if (std::find(mine.begin(), mine.end(), c->core) != mine.end()) out.push_back(c->id);
      }
      break;
    }
    case NumaBinding::kCoreComplex: {
      std::vector<std::string> complexes;  // in CPU order; "" (unknown): one per node
      for (const auto* c : on_node) {
        if (std::find(complexes.begin(), complexes.end(), c->l3) == complexes.end()) {
          complexes.push_back(c->l3);
        }
      }
      const std::string& mine = complexes[static_cast<size_t>(place) % complexes.size()];
      for (const auto* c : on_node) {
        if (c->l3 == mine) out.push_back(c->id);
      }
      break;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  return format_rank_list(cpus, ",");
}

}  // namespace ddp::launcher
