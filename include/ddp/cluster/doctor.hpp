#pragma once
// doctor: checks the things that make multi-node training hang or fail before it starts (or
// run slowly), one verdict line each: cluster detection, socket interface variables, GPUs and
// NCCL, the BLAS LibTorch uses on CPU, and, given an endpoint (the master's store), name
// resolution, route, TCP connect, store authentication and clock skew. ddprun exposes it as
// `ddprun doctor`; the standalone binary is `ddp-doctor`.
//
// Contracts: every network step is bounded by options.timeout; only the endpoint given (or
// MASTER_ADDR:MASTER_PORT) is contacted, and the route check sends no packet. run_doctor
// never throws for a failed check: failures are results. It throws UsageError only for
// malformed options (an endpoint that is not host:port).

#include <chrono>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ddp/cluster/detect.hpp"
#include "ddp/cluster/environment.hpp"

namespace ddp::cluster {

enum class CheckStatus { kOk, kWarn, kFail, kSkip };
const char* to_string(CheckStatus status);  // "ok", "warn", "FAIL", "skip"

struct CheckResult {
  std::string name;  // "connect", "NCCL_SOCKET_IFNAME", ...
  CheckStatus status = CheckStatus::kOk;
  std::string verdict;  // one line: what was found and, when not ok, the fix
};

struct DoctorOptions {
  static constexpr std::chrono::milliseconds kDefaultTimeout{3000};
  static constexpr const char* kDefaultNvidiaDir = "/proc/driver/nvidia/gpus";
  static constexpr const char* kDefaultNcclLibrary = "libnccl.so.2";
  static constexpr const char* kDefaultBlasLibrary = "libblas.so.3";

  // "host:port" (IPv6 as "[addr]:port") of the master's store. Unset: MASTER_ADDR and
  // MASTER_PORT from the environment; neither: the network checks are skipped.
  std::optional<std::string> endpoint;
  // Store token (ddp-doctor and `ddprun doctor` read it from --token-file); unset:
  // $DDP_STORE_TOKEN, else the file $DDP_STORE_TOKEN_FILE names (as TcpStore does).
  std::optional<std::string> token;
  // Limit for each network step (resolve, connect, store handshake, clock read).
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // The environment to check; unset: this process's.
  std::optional<EnvMap> env;
  // Where the NVIDIA driver lists GPUs (one directory per GPU), and the NCCL library to look
  // for; tests point these elsewhere.
  std::string nvidia_dir = kDefaultNvidiaDir;
  std::string nccl_library = kDefaultNcclLibrary;
  // The BLAS LibTorch's CPU matmuls use (Debian's alternatives pick the implementation).
  std::string blas_library = kDefaultBlasLibrary;
  // Passed to cluster detection (hostname, scheduler, explicit values).
  DetectOptions detect;
};

// Runs every check, in a fixed order, and returns one result per check.
std::vector<CheckResult> run_doctor(const DoctorOptions& options);

// One line per result: "[ ok ] connect              connected to 127.0.0.1:29500 in 0.2 ms",
// then a summary line.
void print_doctor_report(std::ostream& out, const std::vector<CheckResult>& results);

// 1 when any check failed, else 0.
int doctor_exit_code(const std::vector<CheckResult>& results);

// "host:port" / "[v6]:port" / "host" (port 29500) -> host and port (0 allowed: a server's
// "any free port"). UsageError on garbage.
std::pair<std::string, uint16_t> parse_endpoint(const std::string& endpoint);

}  // namespace ddp::cluster
