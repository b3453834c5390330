#include "ddp/comm/init.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "async_process_group.hpp"
#include "cpu/cpu_process_group.hpp"
#include "ddp/comm/world_info.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "gloo/gloo_process_group.hpp"
#include "host_topology.hpp"

#ifdef DDP_HAVE_MPI_BACKEND
#include "mpi_plugin.hpp"
#endif
#ifdef DDP_HAVE_NCCL_BACKEND
#include "ddp/comm/nccl_process_group.hpp"
#endif

namespace ddp {

namespace {

std::shared_ptr<Store> store_from_env(int rank, int world_size, const WorldInfo& world,
                                      std::chrono::milliseconds timeout);

size_t inline_bytes() {
  const auto v = env::get_int("DDP_CPU_INLINE_BYTES");
  if (v && *v < 0) throw UsageError(fmt::format("DDP_CPU_INLINE_BYTES={} is negative", *v));
  return v ? static_cast<size_t>(*v) : 65536;
}

bool debug_collectives_requested(const InitOptions& options) {
  return options.debug_collectives.value_or(env::get_bool("DDP_DEBUG_COLLECTIVES", false));
}

// The fingerprint check compares calls through the group's store, which the mpi group does not
// have (mpirun gives it rank and size) and the nccl group does not consult per call. Saying so
// beats letting the user believe every collective is compared.
void warn_debug_collectives_unchecked(const InitOptions& options, const std::string& backend) {
  if (!debug_collectives_requested(options)) return;
  log::get("ddp.comm")
      ->warn(
          "DDP_DEBUG_COLLECTIVES: backend {} does not compare collectives across ranks (only "
          "cpu and gloo do); its collectives run unchecked. To find a mismatched call, run "
          "the job once with backend cpu or gloo",
          backend);
}

}  // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> b{"cpu", "gloo"};
#ifdef DDP_HAVE_MPI_BACKEND
  b.push_back("mpi");
#endif
#ifdef DDP_HAVE_NCCL_BACKEND
  b.push_back("nccl");
#endif
  return b;
}

ProcessGroupPtr init_process_group(const InitOptions& options) {
  const std::string& backend = options.backend;
  const auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), backend) == backends.end()) {
    if (backend == "mpi" || backend == "nccl") {
      throw UsageError(fmt::format(
          "backend {} is not built: this build of ddp found no {} (available: {}); install "
          "{} and rebuild, or use backend \"cpu\"",
          backend, backend == "mpi" ? "MPI library" : "CUDA/NCCL", backends,
          backend == "mpi" ? "libopenmpi-dev" : "CUDA and NCCL"));
    }
    throw UsageError(fmt::format("unknown backend \"{}\"; available: {}", backend, backends));
  }
  if (options.timeout.count() <= 0) {
    throw UsageError(
        fmt::format("InitOptions.timeout must be positive (got {} ms)", options.timeout.count()));
  }
#ifdef DDP_HAVE_MPI_BACKEND
  // MPI knows its own rank and size from mpirun; no store needed.
  if (backend == "mpi") {
    warn_debug_collectives_unchecked(options, backend);
    return mpi_detail::mpi_plugin().make_process_group(options.timeout);
  }
#endif

  WorldInfo world;
  if (!options.rank || !options.world_size) world = detect_world_info();
  const int rank = options.rank.value_or(world.rank);
  const int size = options.world_size.value_or(world.world_size);
  if (size < 1 || rank < 0 || rank >= size) {
    throw UsageError(
        fmt::format("rank {} is out of range for world size {}; rank must be in "
                    "[0, world_size)",
                    rank, size));
  }
  std::shared_ptr<Store> store = options.store;
  if (!store) store = store_from_env(rank, size, world, options.timeout);

#ifdef DDP_HAVE_NCCL_BACKEND
  if (backend == "nccl") {
    int device = options.device.value_or(
        world.local_rank.value_or(static_cast<int>(env::get_int("LOCAL_RANK").value_or(0))));
    warn_debug_collectives_unchecked(options, backend);
    NcclOptions nccl = NcclOptions::from_env(options.timeout);
    nccl.group_name = options.group_name;  // the unique-id exchange keys on it
    nccl.interrupt = options.interrupt;
    nccl.host_id = options.host_id.value_or(detail::default_host_id());
    return make_nccl_process_group(store, rank, size, device, nccl);
  }
#endif

  detail::GroupConfig config;
  config.store = store;
  config.rank = rank;
  config.size = size;
  config.timeout = options.timeout;
  config.debug_collectives = debug_collectives_requested(options);
  config.inline_bytes = inline_bytes();
  config.backend = backend;
  config.flight_recorder_entries = FlightRecorder::entries_from_env();
  config.flight_recorder_dir = FlightRecorder::dir_from_env();
  // Every rank adds one; the n-th group initialised under this name on this store gets
  // generation n-1. A rank cannot start generation g+1 before all ranks joined generation g,
  // because init blocks until every rank published its host id.
  const int64_t joined = store->add(options.group_name + "/init_count", 1);
  const int64_t generation = (joined - 1) / size;
  config.prefix = fmt::format("{}/{}/", options.group_name, generation);

  if (backend == "gloo") return std::make_shared<detail::GlooProcessGroup>(std::move(config));
  const std::string host = options.host_id.value_or(detail::default_host_id());
  return std::make_shared<detail::CpuProcessGroup>(std::move(config), host);
}

ProcessGroupPtr new_group(const ProcessGroupPtr& parent, const std::vector<int>& ranks) {
  if (!parent) throw UsageError("new_group: parent process group is null");
  auto* async = dynamic_cast<detail::AsyncProcessGroup*>(parent.get());
  if (async == nullptr) {
    throw NotSupportedError(
        fmt::format("backend {} does not support new_group", parent->backend_name()));
  }
  return async->create_subgroup(ranks);
}

namespace {

std::shared_ptr<Store> store_from_env(int rank, int world_size, const WorldInfo& world,
                                      std::chrono::milliseconds timeout) {
  const auto addr = env::get("MASTER_ADDR");
  const auto port = env::get_int("MASTER_PORT");
  if (world_size == 1 && (!addr || !port)) {
    // A single rank needs nobody to rendezvous with.
    auto store = std::make_shared<HashStore>();
    store->set_timeout(timeout);
    return store;
  }
  // mpirun gives every rank its rank and size but no store address: MPI carries rank 0's.
  const bool started_by_mpirun =
      world.source == "openmpi" ||
      (world.source == "default" && env::get("OMPI_COMM_WORLD_SIZE").has_value());
#ifdef DDP_HAVE_MPI_BACKEND
  if (started_by_mpirun && !port) {
    return mpi_detail::mpi_plugin().bootstrap_store(rank, world_size, timeout);
  }
#endif
  if (!addr || addr->empty() || !port) {
    throw UsageError(fmt::format(
        "init_process_group: no store given and MASTER_ADDR/MASTER_PORT are not set (rank {} "
        "of {}); launch with ddprun/torchrun, export MASTER_ADDR and MASTER_PORT, or pass "
        "InitOptions.store{}",
        rank, world_size,
        started_by_mpirun ? "; this build has no MPI (install libopenmpi-dev and rebuild) to "
                            "bootstrap mpirun jobs without them"
                          : ""));
  }
  if (*port <= 0 || *port > 65535) {
    throw UsageError(fmt::format("MASTER_PORT={} is not a valid TCP port (1..65535)", *port));
  }
  // As torch's env:// rendezvous: rank 0 hosts the store, everyone connects to it.
  TcpStoreOptions o;
  o.host = *addr;
  o.port = static_cast<uint16_t>(*port);
  o.timeout = timeout;
  // Under ddprun --recovery step the launcher hosts this store, so it outlives any rank.
  o.is_server = rank == 0 && env::get("DDP_RECOVERY").value_or("") != "step";
  // ddprun --recovery step keeps standbys of its store: a call goes on with the promoted one.
  if (!o.is_server) o.standbys = standbys_from_env();
  return std::make_shared<TcpStore>(o);
}

}  // namespace

}  // namespace ddp
