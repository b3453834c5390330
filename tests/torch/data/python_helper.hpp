#pragma once
// Runs DDP_TEST_PYTHON (the build's interpreter with torch, .venv/bin/python) for cross-checks
// against PyTorch itself. The
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
  // The references compute on the CPU. GPUs are hidden from them: with a CUDA torch on a GPU
  // machine some of PyTorch's CPU paths call CUDA APIs with the CPU device (the PowerSGD hook's
  // torch.cuda.synchronize(cpu) fails "Expected a cuda device, but got: cpu").
  FILE* p = ::popen(("CUDA_VISIBLE_DEVICES= " + std::string(DDP_TEST_PYTHON) + " " +
                     std::string(path) + " " + args)
                        .c_str(),
                    "r");
  if (p) {
    std::array<char, 65536> buf{};
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    r.status = ::pclose(p);
  }
  ::unlink(path);
  return r;
}

// Empty when DDP_TEST_PYTHON can import torch; else why not (for GTEST_SKIP).
inline std::string python_torch_unavailable() {
  static const std::string reason = [] {
    const std::string python = DDP_TEST_PYTHON;
    if (python.empty() || ::access(python.c_str(), X_OK) != 0) {
      return "no interpreter '" + python + "' (run scripts/install-deps.sh, which makes .venv/)";
    }
    PythonResult r = run_python("import torch\nprint(torch.__version__)\n");
    if (r.status != 0) {
      return python + " cannot import torch (run scripts/install-deps.sh)";
    }
    return std::string();
  }();
  return reason;
}

}  // namespace ddp::test
