#pragma once
// Runs Debian's /usr/bin/python3 with torch for cross-checks against PyTorch itself. The
// expected values are computed by PyTorch at test time, never checked in.

#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

namespace ddp::test {

struct PythonResult {
  int status = -1;
  std::string out;  // stdout
};

// Writes `script` to a temporary file and runs it; stderr goes to the test's stderr.
inline PythonResult run_python(const std::string& script, const std::string& args = "") {
  char path[] = "/tmp/ddp_py_XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return {};
  ::close(fd);
  std::ofstream(path) << script;
  PythonResult r;
  FILE* p = ::popen(("/usr/bin/python3 " + std::string(path) + " " + args).c_str(), "r");
  if (p) {
    std::array<char, 65536> buf{};
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    r.status = ::pclose(p);
  }
  ::unlink(path);
  return r;
}

// Empty when /usr/bin/python3 can import torch; else why not (for GTEST_SKIP).
inline std::string python_torch_unavailable() {
  static const std::string reason = [] {
    if (::access("/usr/bin/python3", X_OK) != 0) return std::string("/usr/bin/python3 is absent");
    PythonResult r = run_python("import torch\nprint(torch.__version__)\n");
    if (r.status != 0) {
      return std::string("/usr/bin/python3 cannot import torch (install python3-torch)");
    }
    return std::string();
  }();
  return reason;
}

}  // namespace ddp::test
