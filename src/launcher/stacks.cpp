#include "ddp/launcher/stacks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace {

using nlohmann::json;

// A Python frame outside the user's code: the interpreter's library or an installed package.
bool is_library_path(const std::string& path) {
  return path.find("/site-packages/") != std::string::npos ||
         path.find("/dist-packages/") != std::string::npos ||
         path.find("/lib/python3") != std::string::npos || path.rfind("<frozen ", 0) == 0;
}

// A native frame of the C library or the kernel interface, which says little about where the
// program is: "clock_nanosleep@GLIBC_2.2.5", "__futex_abstimed_wait_common", "epoll_wait".
bool is_system_function(const std::string& f) {
  static const char* kCalls[] = {"nanosleep", "clock_nanosleep", "poll",  "ppoll",   "epoll_wait",
                                 "select",    "pselect",         "read",  "write",   "recv",
                                 "recvmsg",   "recvfrom",        "send",  "sendmsg", "accept",
                                 "accept4",   "connect",         "sleep", "usleep",  "wait4",
                                 "waitpid",   "syscall",         "pause", "??"};
  if (f.rfind("__", 0) == 0 || f.find("@GLIBC") != std::string::npos ||
      f.rfind("pthread_", 0) == 0 || f.rfind("std::condition_variable::", 0) == 0) {
    return true;
  }
  return std::find(std::begin(kCalls), std::end(kCalls), f) != std::end(kCalls);
}

bool same_frame(const StackFrame& a, const StackFrame& b) {
  return a.function == b.function && a.file == b.file && a.line == b.line;
}

std::string position(const StackFrame& f) {
  if (f.file.empty()) return "";
  return f.line > 0 ? fmt::format("{}:{}", f.file, f.line) : f.file;
}

// The key two ranks must share to fold: every thread's name and frames, main thread first.
std::string fold_key(const RankStacks& s) {
  if (!s.error.empty()) return "error:" + s.error;
  std::string key = s.tool + "\n";
  for (const auto& t : s.threads) {
    key += (t.tid == s.main_tid() ? "main " : "thread ") + t.name + "\n";
    for (const auto& f : t.frames) key += f.function + "\t" + position(f) + "\n";
  }
  return key;
}

const ThreadStack* main_thread(const RankStacks& s) {
  for (const auto& t : s.threads) {
    if (t.tid == s.main_tid() || t.name == "MainThread") return &t;
  }
  return s.threads.empty() ? nullptr : &s.threads.front();
}

// Python frames carry a library flag in their file path; the frame list is innermost first.
bool is_user_frame(const StackFrame& f) {
  return !f.file.empty() && f.line > 0 && !is_library_path(f.file);
}

std::string display_file(const std::string& file) {
  // py-spy reports absolute paths; a report names the file the user wrote (train.py:88) or the
  // package path from site-packages on (torch/distributed/distributed_c10d.py:3252).
  for (const char* marker : {"/site-packages/", "/dist-packages/"}) {
    const size_t at = file.rfind(marker);
    if (at != std::string::npos) return file.substr(at + std::string(marker).size());
  }
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? file : file.substr(slash + 1);
}

std::string frame_text(const StackFrame& f) {
  if (f.file.empty()) return f.function;
  return f.line > 0 ? fmt::format("{} ({}:{})", f.function, display_file(f.file), f.line)
                    : fmt::format("{} ({})", f.function, display_file(f.file));
}

}  // namespace

std::vector<ThreadStack> parse_py_spy_json(const std::string& text) {
  std::vector<ThreadStack> out;
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_array()) return out;
  for (const auto& t : doc) {
    if (!t.is_object()) continue;
    ThreadStack ts;
    if (t.contains("os_thread_id") && t["os_thread_id"].is_number_integer()) {
      ts.tid = t["os_thread_id"].get<int64_t>();
    }
    if (t.contains("thread_name") && t["thread_name"].is_string()) {
      ts.name = t["thread_name"].get<std::string>();
    }
    if (t.contains("frames") && t["frames"].is_array()) {
      for (const auto& f : t["frames"]) {
        if (!f.is_object()) continue;
        StackFrame sf;
        if (f.contains("name") && f["name"].is_string()) sf.function = f["name"];
        if (f.contains("filename") && f["filename"].is_string()) sf.file = f["filename"];
        if (f.contains("line") && f["line"].is_number_integer()) sf.line = f["line"].get<int>();
        ts.frames.push_back(std::move(sf));
      }
    }
    out.push_back(std::move(ts));
  }
  return out;
}

std::vector<ThreadStack> parse_eu_stack(const std::string& text) {
  std::vector<ThreadStack> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("TID ", 0) == 0) {
      ThreadStack t;
      t.tid = std::strtoll(line.c_str() + 4, nullptr, 10);
      out.push_back(std::move(t));
      continue;
    }
    // "#3  0x00007f38a2312501 c10d::ProcessGroupGloo::runLoop(int)" (function may be absent)
    if (line.empty() || line[0] != '#' || out.empty()) continue;
    std::istringstream fields(line);
    std::string index, address;
    fields >> index >> address;
    std::string function;
    std::getline(fields, function);
    const size_t first = function.find_first_not_of(' ');
    function = first == std::string::npos ? "??" : function.substr(first);
    // "- /usr/lib/x.so" or " [file:line]" details are not requested (no -m/-s flags).
    out.back().frames.push_back({function, "", 0});
  }
  return out;
}

std::string rank_list_text(const std::vector<int>& ranks_in) {
  std::vector<int> ranks = ranks_in;
  std::sort(ranks.begin(), ranks.end());
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) s += ",";
    s += j >= i + 2
             ? fmt::format("{}-{}", ranks[i], ranks[j])
             : (j == i + 1 ? fmt::format("{},{}", ranks[i], ranks[j]) : std::to_string(ranks[i]));
    i = j + 1;
  }
  return s;
}

std::vector<StackGroup> fold_stacks(const std::vector<RankStacks>& stacks) {
  std::vector<std::pair<std::string, StackGroup>> groups;
  std::vector<const RankStacks*> sorted;
  for (const auto& s : stacks) sorted.push_back(&s);
  std::sort(sorted.begin(), sorted.end(), [](const RankStacks* a, const RankStacks* b) {
    return a->global_rank < b->global_rank;
  });
  for (const RankStacks* s : sorted) {
    const std::string key = fold_key(*s);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, StackGroup{{s->global_rank}, *s}});
    } else {
      it->second.ranks.push_back(s->global_rank);
    }
  }
  std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    const bool a_err = !a.second.sample.error.empty(), b_err = !b.second.sample.error.empty();
    if (a_err != b_err) return !a_err;
    if (a.second.ranks.size() != b.second.ranks.size())
      return a.second.ranks.size() < b.second.ranks.size();
    return a.second.ranks.front() < b.second.ranks.front();
  });
  std::vector<StackGroup> out;
  for (auto& g : groups) out.push_back(std::move(g.second));
  return out;
}

std::string where_text(const RankStacks& s) {
  if (!s.error.empty()) return "unknown (" + s.error + ")";
  const ThreadStack* t = main_thread(s);
  if (t == nullptr || t->frames.empty()) return "no frames";
  const StackFrame& top = t->frames.front();
  const bool python = std::any_of(t->frames.begin(), t->frames.end(),
                                  [](const StackFrame& f) { return f.line > 0; });
  if (python) {
    auto user = std::find_if(t->frames.begin(), t->frames.end(), is_user_frame);
    if (user == t->frames.begin()) {
      return fmt::format("{} at {}:{}", top.function, display_file(top.file), top.line);
    }
    if (user == t->frames.end()) return frame_text(top);
    return fmt::format("{} called from {}:{}", top.function, display_file(user->file), user->line);
  }
  auto own = std::find_if(t->frames.begin(), t->frames.end(),
                          [](const StackFrame& f) { return !is_system_function(f.function); });
  if (own == t->frames.end() || own == t->frames.begin()) return top.function;
  return fmt::format("{} called from {}", top.function, own->function);
}

std::string stacks_summary(const std::vector<RankStacks>& stacks) {
  std::string out;
  for (const auto& g : fold_stacks(stacks)) {
    out += fmt::format("{}{} {} {}", out.empty() ? "" : "; ", rank_list_text(g.ranks),
                       g.ranks.size() == 1 ? "was in" : "were in", where_text(g.sample));
  }
  return out;
}

std::vector<std::string> format_folded(const std::vector<RankStacks>& stacks,
                                       bool main_thread_only) {
  std::vector<std::string> lines;
  for (const auto& g : fold_stacks(stacks)) {
    const RankStacks& s = g.sample;
    std::string who =
        fmt::format("{} ({} of {})", rank_list_text(g.ranks), g.ranks.size(), stacks.size());
    if (!s.error.empty()) {
      lines.push_back(fmt::format("{}: no stack: {}", who, s.error));
      continue;
    }
    lines.push_back(fmt::format("{}, {} on {}: {}", who, s.tool, s.host, where_text(s)));
    const ThreadStack* main = main_thread(s);
    if (main_thread_only && s.threads.size() > 1) {
      lines.push_back(fmt::format("  ({} other threads not shown)", s.threads.size() - 1));
    }
    for (const auto& t : s.threads) {
      if (main_thread_only && &t != main) continue;
      lines.push_back(fmt::format("  thread{}{}{}:", t.name.empty() ? "" : " \"" + t.name + "\"",
                                  t.tid == s.main_tid() ? " (main)" : "",
                                  g.ranks.size() == 1 ? fmt::format(", tid {}", t.tid) : ""));
      const StackFrame* previous = nullptr;
      int repeats = 0;
      for (const auto& f : t.frames) {
        // Deep recursion prints once with a count.
        if (previous && same_frame(*previous, f)) {
          ++repeats;
          continue;
        }
        if (repeats > 0)
          lines.push_back(fmt::format("      (the frame above {} more times)", repeats));
        repeats = 0;
        lines.push_back("    " + frame_text(f));
        previous = &f;
      }
      if (repeats > 0)
        lines.push_back(fmt::format("      (the frame above {} more times)", repeats));
    }
  }
  return lines;
}

std::string encode_stacks(const std::vector<RankStacks>& stacks) {
  json out = json::array();
  for (const auto& s : stacks) {
    json threads = json::array();
    for (const auto& t : s.threads) {
      json frames = json::array();
      for (const auto& f : t.frames) frames.push_back({f.function, f.file, f.line});
      threads.push_back({{"tid", t.tid}, {"name", t.name}, {"frames", std::move(frames)}});
    }
    out.push_back({{"rank", s.global_rank},
                   {"pid", s.pid},
                   {"host", s.host},
                   {"tool", s.tool},
                   {"error", s.error},
                   {"threads", std::move(threads)}});
  }
  // Thread names (/proc/<pid>/task/<tid>/comm, cut at 15 bytes, may split a UTF-8 character)
  // and frames are bytes, not checked UTF-8: invalid sequences become U+FFFD instead of the
  // strict handler's type_error.
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<RankStacks> decode_stacks(const std::string& json_text) {
  std::vector<RankStacks> out;
  try {
    const json doc = json::parse(json_text);
    for (const auto& s : doc) {
      RankStacks r;
      r.global_rank = s.at("rank").get<int>();
      r.pid = s.value("pid", int64_t{0});
      r.host = s.value("host", "");
      r.tool = s.value("tool", "");
      r.error = s.value("error", "");
      for (const auto& t : s.at("threads")) {
        ThreadStack ts;
        ts.tid = t.value("tid", int64_t{0});
        ts.name = t.value("name", "");
        for (const auto& f : t.at("frames")) {
          ts.frames.push_back(
              {f.at(0).get<std::string>(), f.at(1).get<std::string>(), f.at(2).get<int>()});
        }
        r.threads.push_back(std::move(ts));
      }
      out.push_back(std::move(r));
    }
  } catch (const json::exception& e) {
    throw ProtocolError(fmt::format("malformed stacks record: {}", e.what()));
  }
  return out;
}

}  // namespace ddp::launcher
