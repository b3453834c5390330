#include "mpi_bootstrap.hpp"

#include <fmt/format.h>

#include <array>
#include <cstring>

#include "ddp/cluster/netinfo.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "ddp/util/socket.hpp"
#include "mpi_runtime.hpp"

namespace ddp::mpi_detail {

namespace {

// Fixed size so the broadcast needs no length exchange: "ok host:port" or "error message".
constexpr size_t kMessageBytes = 1024;

// The address other nodes reach rank 0's store at.
std::string address_to_publish(bool single_node) {
  if (auto addr = env::get("MASTER_ADDR"); addr && !addr->empty()) return *addr;
  if (single_node) return "127.0.0.1";
  const auto wanted = env::get("DDP_GLOO_IFNAME");
  for (const auto& iface : cluster::list_interfaces()) {
    if (!iface.up || iface.loopback) continue;
    if (wanted && !wanted->empty() && iface.name != *wanted) continue;
    for (const auto& a : iface.addresses) {
      if (a.find(':') == std::string::npos) return a;  // IPv4 first: every resolver takes it
    }
  }
  throw NetworkError(fmt::format(
      "mpirun bootstrap: rank 0 found no {} network interface with an IPv4 address to host "
      "the store on; set MASTER_ADDR to an address the other nodes can reach",
      wanted && !wanted->empty() ? "up interface named " + *wanted + " (DDP_GLOO_IFNAME)"
                                 : "non-loopback"));
}

void broadcast(std::array<char, kMessageBytes>& message) {
  Runtime& runtime = Runtime::get();
  auto lock = runtime.lock();
  const int rc =
      MPI_Bcast(message.data(), static_cast<int>(message.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) {
    throw CollectiveError("mpirun bootstrap: MPI_Bcast of the store address failed: " +
                          error_string(rc));
  }
}

}  // namespace

std::shared_ptr<Store> bootstrap_store_over_mpi(int rank, int world_size,
                                                std::chrono::milliseconds timeout) {
  Runtime& runtime = Runtime::get();
  int mpi_rank = -1;
  int mpi_size = -1;
  {
    auto lock = runtime.lock();
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  }
  if (mpi_rank != rank || mpi_size != world_size) {
    throw UsageError(fmt::format(
        "mpirun bootstrap: this process is rank {} of {} for init_process_group but rank {} of "
        "{} in MPI_COMM_WORLD; drop the explicit rank/world_size or set MASTER_ADDR and "
        "MASTER_PORT",
        rank, world_size, mpi_rank, mpi_size));
  }

  std::array<char, kMessageBytes> message{};
  std::shared_ptr<TcpStore> server;
  if (rank == 0) {
    std::string text;
    try {
      const auto local_size = env::get_int("OMPI_COMM_WORLD_LOCAL_SIZE");
      const bool single_node = local_size && *local_size == world_size;
      const std::string host = address_to_publish(single_node);
      TcpStoreOptions o;
      o.host = "127.0.0.1";
      o.port = 0;
      o.timeout = timeout;
      o.is_server = true;
      server = std::make_shared<TcpStore>(o);
      text = fmt::format("ok {} {}", host, server->port());
      log::get("ddp.comm")
          ->info(
              "init_process_group: started by mpirun without MASTER_ADDR/MASTER_PORT: rank 0 "
              "hosts the store at {} and sent that address to the {} ranks over MPI",
              net::format_endpoint(host, server->port()), world_size);
    } catch (const std::exception& e) {
      text = std::string("error ") + e.what();
    }
    std::strncpy(message.data(), text.c_str(), message.size() - 1);
    broadcast(message);
    if (!server) throw NetworkError(std::string(message.data()).substr(6));
    return server;
  }

  broadcast(message);
  const std::string text(message.data());
  if (text.rfind("ok ", 0) != 0) {
    throw NetworkError(fmt::format("mpirun bootstrap: rank 0 could not host the store: {}",
                                   text.substr(text.find(' ') + 1)));
  }
  const auto space = text.rfind(' ');
  TcpStoreOptions o;
  o.host = text.substr(3, space - 3);
  o.port = static_cast<uint16_t>(std::stoi(text.substr(space + 1)));
  o.timeout = timeout;
  return std::make_shared<TcpStore>(o);
}

}  // namespace ddp::mpi_detail
