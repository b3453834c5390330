// Reading flight recorder dumps for the hang report: ddp's own (parse_flight_dump), PyTorch's as
// ddprun's Python hook writes them (parse_torch_flight_dump), and the files or directories
// `ddprun trace` is given (read_flight_dumps).
#include "ddp/launcher/hang_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace fs = std::filesystem;

FlightDump parse_flight_dump(const std::string& json_text, const std::string& path) {
  using nlohmann::json;
  FlightDump d;
  d.path = path;
  try {
    const json j = json::parse(json_text);
    if (j.value("format", "") != "ddp-flight-recorder") {
      throw UsageError(fmt::format(
          "{}: not a flight recorder dump (no \"format\": \"ddp-flight-recorder\")", path));
    }
    d.group = j.value("group", d.group);
    d.backend = j.value("backend", "");
    d.rank = j.at("rank").get<int>();
    d.global_rank = j.value("global_rank", d.rank);
    d.group_size = j.at("group_size").get<int>();
    d.global_ranks = j.value("global_ranks", std::vector<int>{});
    d.pid = j.value("pid", int64_t{0});
    d.host = j.value("host", "");
    d.reason = j.value("reason", "");
    d.dumped_at_us = j.value("dumped_at_us", int64_t{0});
    d.recorded = j.value("recorded", uint64_t{0});
    for (const auto& e : j.at("entries")) {
      FlightEntry f;
      f.seq = e.at("seq").get<uint64_t>();
      f.op = e.at("op").get<std::string>();
      f.dtype = e.value("dtype", "");
      f.count = e.value("count", uint64_t{0});
      f.reduce_op = e.value("reduce_op", "");
      f.root = e.value("root", -1);
      f.state = e.at("state").get<std::string>();
      f.queued_us = e.value("queued_us", int64_t{0});
      f.started_us = e.value("started_us", int64_t{0});
      f.ended_us = e.value("ended_us", int64_t{0});
      f.tag = e.value("tag", "");
      f.error = e.value("error", "");
      d.entries.push_back(std::move(f));
    }
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{}: malformed flight recorder dump: {}", path, e.what()));
  }
  return d;
}

namespace {

bool is_dump_name(const std::string& name) {
  const bool json_file = name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0;
  return json_file &&
         (name.rfind("flight_recorder.", 0) == 0 || name.rfind("torch_fr.rank", 0) == 0);
}

std::vector<int> parse_rank_list_text(const std::string& text) {
  std::vector<int> ranks;
  const char* p = text.c_str();
  while (*p) {
    if (std::isdigit(static_cast<unsigned char>(*p))) {
      char* end = nullptr;
      ranks.push_back(static_cast<int>(std::strtol(p, &end, 10)));
      p = end;
    } else {
      ++p;
    }
  }
  return ranks;
}

}  // namespace

std::vector<FlightDump> parse_torch_flight_dump(const std::string& json_text,
                                                const std::string& path) {
  using nlohmann::json;
  std::vector<FlightDump> out;
  try {
    const json j = json::parse(json_text);
    if (j.value("format", "") != "torch-flight-recorder") {
      throw UsageError(fmt::format(
          "{}: not a PyTorch flight recorder dump (no \"format\": \"torch-flight-recorder\")",
          path));
    }
    const json& trace = j.at("trace");
    const int global_rank = j.at("rank").get<int>();
    std::map<std::string, FlightDump> groups;  // by pg id
    auto group_of = [&](const std::string& pg_id, const std::string& name) -> FlightDump& {
      FlightDump& d = groups[pg_id];
      if (d.group.rfind("torch:", 0) == 0) return d;
      d.path = path;
      d.group = "torch:" + (name.empty() ? pg_id : name);
      d.global_rank = global_rank;
      d.pid = j.value("pid", int64_t{0});
      d.host = j.value("host", "");
      d.dumped_at_us = j.value("dumped_at_us", int64_t{0});
      d.reason = "PyTorch flight recorder (ddprun's hook)";
      const json& configs = trace.value("pg_config", json::object());
      for (const auto& [key, config] : configs.items()) {
        if (configs.size() == 1 || key == pg_id || key == name) {
          d.global_ranks = parse_rank_list_text(config.value("ranks", ""));
        }
      }
      d.group_size = static_cast<int>(std::max<size_t>(d.global_ranks.size(), 1));
      const auto me = std::find(d.global_ranks.begin(), d.global_ranks.end(), global_rank);
      d.rank =
          me == d.global_ranks.end() ? global_rank : static_cast<int>(me - d.global_ranks.begin());
      return d;
    };
    const json& status = trace.value("pg_status", json::object());
    for (const auto& e : trace.value("entries", json::array())) {
      if (e.value("is_p2p", false)) continue;
      const std::string pg_id = std::to_string(e.value("pg_id", 0));
      const json& pg = e.value("process_group", json::array());
      FlightDump& d = group_of(pg_id, pg.size() > 1 ? pg[1].get<std::string>() : "");
      FlightEntry f;
      f.seq = e.value("collective_seq_id", uint64_t{0});
      std::string op = e.value("profiling_name", "");
      const size_t colon = op.find(':');
      if (colon != std::string::npos) {
        d.backend = op.substr(0, colon);
        op = op.substr(colon + 1);
      }
      f.op = op;
      const json& dtypes = e.value("input_dtypes", json::array());
      if (!dtypes.empty() && dtypes[0].is_string()) {
        f.dtype = dtypes[0].get<std::string>();
        // PyTorch's scalar type names, as torch.dtype spells them.
        static const std::map<std::string, std::string> kNames = {
            {"Float", "float32"},     {"Double", "float64"}, {"Half", "float16"},
            {"BFloat16", "bfloat16"}, {"Long", "int64"},     {"Int", "int32"},
            {"Short", "int16"},       {"Char", "int8"},      {"Byte", "uint8"},
            {"Bool", "bool"}};
        const auto known = kNames.find(f.dtype);
        if (known != kNames.end()) f.dtype = known->second;
      }
      const json& sizes = e.value("input_sizes", json::array());
      if (!sizes.empty() && sizes[0].is_array()) {
        f.count = 1;
        for (const auto& n : sizes[0]) f.count *= n.get<uint64_t>();
      }
      int64_t done = -1;
      if (status.contains(pg_id)) {
        const json& st = status[pg_id].value("last_completed_collective", json("-1"));
        done = st.is_string() ? std::atoll(st.get<std::string>().c_str()) : st.get<int64_t>();
      }
      f.state = static_cast<int64_t>(f.seq) <= done ? "completed" : "started";
      f.queued_us = e.value("time_created_ns", int64_t{0}) / 1000;
      f.started_us = f.queued_us;
      d.entries.push_back(std::move(f));
      d.recorded = std::max<uint64_t>(d.recorded, d.entries.back().seq);
    }
    for (auto& [id, d] : groups) out.push_back(std::move(d));
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{}: malformed PyTorch flight recorder dump: {}", path, e.what()));
  }
  return out;
}

std::vector<FlightDump> read_flight_dumps(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::recursive_directory_iterator(p, ec)) {
        const std::string name = entry.path().filename().string();
        if (entry.is_regular_file() && is_dump_name(name)) {
          found.push_back(entry.path().string());
        }
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(p, ec)) {
      files.push_back(p);
    } else {
      throw UsageError(fmt::format("ddprun trace: {} does not exist", p));
    }
  }
  if (files.empty()) {
    throw UsageError(
        "ddprun trace: no flight recorder dumps (flight_recorder.*.json, torch_fr.rank*.json) "
        "found; pass the files "
        "or the run's log directory");
  }
  std::vector<FlightDump> dumps;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) throw UsageError(fmt::format("ddprun trace: cannot read {}", f));
    const std::string text = ss.str();
    if (text.find("\"torch-flight-recorder\"") != std::string::npos) {
      for (auto& d : parse_torch_flight_dump(text, f)) dumps.push_back(std::move(d));
    } else {
      dumps.push_back(parse_flight_dump(text, f));
    }
  }
  return dumps;
}

}  // namespace ddp::launcher
