// Multi-node hang report: each node's share (its dumps, cut short, and its view of its ranks'
// processes) as one JSON text for the rendezvous store, and the report over every node's share.
#include "ddp/launcher/hang_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace ddp::launcher {

namespace fs = std::filesystem;

namespace {

const char* state_name(RankProcess::State s) {
  switch (s) {
    case RankProcess::State::kRunning:
      return "running";
    case RankProcess::State::kStopped:
      return "stopped";
    case RankProcess::State::kExited:
      return "exited";
    case RankProcess::State::kUninterruptible:
      return "uninterruptible";
  }
  return "running";
}

RankProcess::State state_from(const std::string& s) {
  if (s == "stopped") return RankProcess::State::kStopped;
  if (s == "exited") return RankProcess::State::kExited;
  if (s == "uninterruptible") return RankProcess::State::kUninterruptible;
  return RankProcess::State::kRunning;
}

}  // namespace

std::string encode_node_records(const std::string& dir, const std::vector<RankProcess>& processes,
                                const std::string& host) {
  using nlohmann::json;
  json doc;
  doc["format"] = "ddp-hang-records";
  doc["host"] = host;
  json procs = json::array();
  for (const auto& p : processes) {
    procs.push_back({{"global_rank", p.global_rank},
                     {"pid", p.pid},
                     {"host", p.host},
                     {"state", state_name(p.state)},
                     {"exit", p.exit},
                     {"wchan", p.wchan},
                     {"at_us", p.at_us}});
  }
  doc["processes"] = std::move(procs);
  json dumps = json::array();
  std::vector<FlightDump> unused;
  std::error_code ec;
  if (!dir.empty() && fs::is_directory(dir, ec)) {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("flight_recorder.", 0) == 0 && name.size() > 5 &&
          name.compare(name.size() - 5, 5, ".json") == 0) {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      std::stringstream ss;
      ss << in.rdbuf();
      json d = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
      if (d.is_discarded() || !d.contains("entries") || !d["entries"].is_array()) continue;
      json& entries = d["entries"];
      if (entries.size() > kSharedEntries) {
        entries.erase(entries.begin(), entries.end() - static_cast<ptrdiff_t>(kSharedEntries));
      }
      dumps.push_back({{"path", host + ":" + f}, {"dump", std::move(d)}});
    }
  }
  if (dumps.empty() && processes.empty()) return "";
  doc["dumps"] = std::move(dumps);
  return doc.dump();
}

std::vector<std::string> hang_report_for_nodes(const std::vector<std::string>& node_records) {
  using nlohmann::json;
  std::vector<FlightDump> dumps;
  std::vector<RankProcess> processes;
  std::set<std::pair<std::string, int>> seen;  // (group, global rank)
  std::vector<std::string> problems;
  for (const auto& text : node_records) {
    if (text.empty()) continue;
    try {
      const json doc = json::parse(text);
      for (const auto& p : doc.at("processes")) {
        RankProcess r;
        r.global_rank = p.at("global_rank").get<int>();
        r.pid = p.value("pid", int64_t{0});
        r.host = p.value("host", "");
        r.state = state_from(p.value("state", ""));
        r.exit = p.value("exit", "");
        r.wchan = p.value("wchan", "");
        r.at_us = p.value("at_us", int64_t{0});
        processes.push_back(std::move(r));
      }
      for (const auto& d : doc.at("dumps")) {
        FlightDump f = parse_flight_dump(d.at("dump").dump(), d.value("path", ""));
        if (seen.insert({f.group, f.global_rank}).second) dumps.push_back(std::move(f));
      }
    } catch (const std::exception& e) {
      problems.push_back(std::string("hang report: a node's records could not be read: ") +
                         e.what());
    }
  }
  if (dumps.empty()) return problems;
  std::vector<std::string> lines = analyze_hang(dumps, processes);
  lines.insert(lines.end(), problems.begin(), problems.end());
  return lines;
}

}  // namespace ddp::launcher
