#include "ddp/launcher/memory_cgroup.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace ddp::launcher {

namespace {

// v1 keeps "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages); any
// value this large is no limit in practice.
constexpr uint64_t kUnlimitedAbove = uint64_t{1} << 62;

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

struct CgroupMount {
  std::string root;  // the hierarchy path mounted there
  std::string mount_point;
};

// The mount of the v1 memory controller (version 1) or of the v2 hierarchy (version 2).
std::optional<CgroupMount> find_mount(const std::string& mountinfo, int version) {
  std::istringstream in(mountinfo);
  std::string line;
  while (std::getline(in, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream before(line.substr(0, dash));
    std::string id, parent, dev, root, mount_point;
    if (!(before >> id >> parent >> dev >> root >> mount_point)) continue;
    std::istringstream after(line.substr(dash + 3));
    std::string fstype, source, super_options;
    if (!(after >> fstype >> source >> super_options)) continue;
    if (version == 2 && fstype == "cgroup2") return CgroupMount{root, mount_point};
    if (version == 1 && fstype == "cgroup") {
      for (const auto& opt : split(super_options, ',')) {
        if (opt == "memory") return CgroupMount{root, mount_point};
      }
    }
  }
  return std::nullopt;
}

// The directory of hierarchy path `path` under `mount`: the mount shows the hierarchy from its
// root down, so that prefix is dropped (a container sees its own cgroup as "/").
std::string directory_of(const CgroupMount& mount, const std::string& path) {
  std::string rel = path;
  if (mount.root != "/" && rel.compare(0, mount.root.size(), mount.root) == 0) {
    rel = rel.substr(mount.root.size());
  }
  if (rel == "/") rel.clear();
  return mount.mount_point + rel;
}

std::optional<uint64_t> read_count(const std::string& path) {
  return parse_byte_count(read_small_file(path));
}

std::string parent_dir(const std::string& dir) {
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? std::string() : dir.substr(0, slash);
}

}  // namespace

std::optional<MemoryCgroup> resolve_memory_cgroup(const std::string& proc_pid_cgroup,
                                                  const std::string& mountinfo) {
  std::optional<std::string> v1_path, v2_path;
  std::istringstream in(proc_pid_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    // "hierarchy-id:controller,list:path"; the path may itself hold ':'.
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a);
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      v2_path = path;
      continue;
    }
    for (const auto& c : split(controllers, ',')) {
      if (c == "memory") v1_path = path;
    }
  }
  if (v1_path) {
    if (auto mount = find_mount(mountinfo, 1)) {
      return MemoryCgroup{directory_of(*mount, *v1_path), mount->mount_point, 1};
    }
  }
  if (v2_path) {
    if (auto mount = find_mount(mountinfo, 2)) {
      return MemoryCgroup{directory_of(*mount, *v2_path), mount->mount_point, 2};
    }
  }
  return std::nullopt;
}

std::optional<MemoryCgroup> memory_cgroup_of(pid_t pid) {
  auto cgroup = resolve_memory_cgroup(read_small_file(fmt::format("/proc/{}/cgroup", pid)),
                                      read_small_file("/proc/self/mountinfo"));
  // On a hybrid machine the v2 hierarchy has no memory controller: no memory.events there.
  if (cgroup && cgroup->version == 2 &&
      ::access((cgroup->dir + "/memory.events").c_str(), R_OK) != 0) {
    return std::nullopt;
  }
  return cgroup;
}

std::optional<uint64_t> parse_oom_kill_count(const std::string& text) {
  std::istringstream in(text);
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return std::nullopt;
}

std::optional<uint64_t> parse_byte_count(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  try {
    return std::stoull(word);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

MemoryLimit parse_memory_limit(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  if (!(in >> word)) return {};
  if (word == "max") return MemoryLimit{true, std::nullopt};
  const auto bytes = parse_byte_count(word);
  if (!bytes) return {};
  if (*bytes >= kUnlimitedAbove) return MemoryLimit{true, std::nullopt};
  return MemoryLimit{true, bytes};
}

std::optional<uint64_t> read_oom_kill_count(const MemoryCgroup& cgroup) {
  const char* file = cgroup.version == 1 ? "/memory.oom_control" : "/memory.events";
  return parse_oom_kill_count(read_small_file(cgroup.dir + file));
}

MemoryLimitInfo read_memory_limit(const MemoryCgroup& cgroup) {
  const bool v1 = cgroup.version == 1;
  MemoryLimitInfo info;
  // Ancestors up to the mount point; the root cgroup itself has no limit file in v2.
  for (std::string dir = cgroup.dir; dir.size() >= cgroup.root.size() && !dir.empty();
       dir = parent_dir(dir)) {
    const MemoryLimit limit =
        parse_memory_limit(read_small_file(dir + (v1 ? "/memory.limit_in_bytes" : "/memory.max")));
    if (limit.read) info.read = true;
    if (limit.bytes) {
      info.dir = dir;
      info.bytes = limit.bytes;
      info.peak = read_count(dir + (v1 ? "/memory.max_usage_in_bytes" : "/memory.peak"));
      return info;
    }
    if (dir == cgroup.root) break;
  }
  return info;
}

}  // namespace ddp::launcher
