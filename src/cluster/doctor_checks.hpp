#pragma once
// The doctor's checks, one group per file; doctor.cpp runs them in order. Each returns
// results and never throws for a failed check.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/cluster/doctor.hpp"
#include "ddp/cluster/netinfo.hpp"

namespace ddp::cluster::detail {

// "cluster": detection's explanation; warnings as warn, UsageError as fail.
CheckResult check_cluster(const EnvMap& env, const DetectOptions& options);

// NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, DDP_GLOO_IFNAME when set (each must name existing,
// up interfaces), or one "interfaces" line listing them when none is set. MASTER_ADDR must
// resolve, MASTER_PORT must be a port.
std::vector<CheckResult> check_environment(const EnvMap& env,
                                           const std::vector<NetInterface>& interfaces,
                                           std::chrono::milliseconds timeout);

// "gpus" (driver's GPU list against CUDA_VISIBLE_DEVICES) and "nccl" (library present).
std::vector<CheckResult> check_gpus(const EnvMap& env, const std::string& nvidia_dir,
                                    const std::string& nccl_library);

// "blas": whether `library` (libblas.so.3, what LibTorch's CPU matmuls call) is an optimized
// implementation (OpenBLAS, BLIS, MKL, ATLAS) or the slow reference one.
CheckResult check_blas(const std::string& library);

// "resolve", "route", "connect", "store-auth", "clock-skew" for host:port. Later steps are
// skipped with a reason when an earlier one fails.
std::vector<CheckResult> check_endpoint(const std::string& host, uint16_t port,
                                        const std::optional<std::string>& token,
                                        std::chrono::milliseconds timeout, const EnvMap& env);

std::string format_ms(std::chrono::steady_clock::duration d);

}  // namespace ddp::cluster::detail
