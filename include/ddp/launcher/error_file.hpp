#pragma once
// Reading the error file a worker writes on failure (TORCHELASTIC_ERROR_FILE), in PyTorch's
// @record format:
//   {"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": "...",
//                "timestamp": "1700000000"}}}
// or the plain form {"message": "...", "timestamp": 1700000000}.

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::launcher {

struct ErrorFileMessage {
  std::string message;    // the error's one-line message
  std::string traceback;  // extraInfo.py_callstack, when present
  std::optional<int64_t> timestamp;
};

// nullopt when the file does not exist or is empty. A file that is not in either format
// yields a message saying so (with the path), never an exception: a broken error file must
// not hide the worker's failure.
std::optional<ErrorFileMessage> read_error_file(const std::string& path);

// Same, from the file's text; `source` names it in messages.
std::optional<ErrorFileMessage> parse_error_file(const std::string& text,
                                                 const std::string& source);

}  // namespace ddp::launcher
