#include "ddp/launcher/error_file.hpp"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddp::launcher {

namespace {

std::optional<int64_t> to_timestamp(const nlohmann::json& value) {
  try {
    if (value.is_number_integer()) return value.get<int64_t>();
    if (value.is_string()) return std::stoll(value.get<std::string>());
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

std::optional<ErrorFileMessage> parse_error_file(const std::string& text,
                                                 const std::string& source) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return std::nullopt;
  ErrorFileMessage out;
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("message")) {
    out.message = fmt::format("(error file {} is not PyTorch's error-file JSON: {})", source,
                              text.substr(0, 200));
    return out;
  }
  const auto& message = doc["message"];
  if (message.is_string()) {
    out.message = message.get<std::string>();
    if (doc.contains("timestamp")) out.timestamp = to_timestamp(doc["timestamp"]);
    return out;
  }
  if (message.is_object()) {
    if (message.contains("message") && message["message"].is_string()) {
      out.message = message["message"].get<std::string>();
    } else {
      out.message = "<N/A>";
    }
    if (message.contains("extraInfo") && message["extraInfo"].is_object()) {
      const auto& extra = message["extraInfo"];
      if (extra.contains("py_callstack") && extra["py_callstack"].is_string()) {
        out.traceback = extra["py_callstack"].get<std::string>();
      }
      if (extra.contains("timestamp")) out.timestamp = to_timestamp(extra["timestamp"]);
    }
    return out;
  }
  out.message = message.dump();
  return out;
}

std::optional<ErrorFileMessage> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_error_file(text.str(), path);
}

}  // namespace ddp::launcher
