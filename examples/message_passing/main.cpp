// The message-passing tutorial: rank 0 sends a tensor to every other rank, which prints that
// it arrived. Run it under a launcher, e.g.
//   ddprun --standalone --nproc-per-node 4 build/examples/message_passing/message_passing
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <iostream>

#include "ddp/comm/init.hpp"
#include "ddp/util/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"rank 0 sends a tensor to every other rank"};
  std::string backend = "cpu";
  app.add_option("--backend", backend, "process-group backend (cpu, gloo, mpi)");
  CLI11_PARSE(app, argc, argv);

  try {
    ddp::InitOptions init;
    init.backend = backend;
    auto pg = ddp::init_process_group(init);
    const int rank = pg->rank();

    auto tensor = torch::zeros({1});
    if (rank == 0) {
      tensor.fill_(42.0);
      for (int dst = 1; dst < pg->size(); ++dst) {
        pg->send(tensor.data_ptr(), 1, ddp::DataType::kFloat32, dst, /*tag=*/0)
            ->wait(pg->timeout());
        std::cout << "Rank 0 sent data to Rank " << dst << "\n" << std::flush;
      }
    } else {
      pg->recv(tensor.data_ptr(), 1, ddp::DataType::kFloat32, /*src=*/0, /*tag=*/0)
          ->wait(pg->timeout());
      std::cout << "Rank " << rank << " has received data from rank 0: " << tensor.item<float>()
                << "\n"
                << std::flush;
    }
    pg->barrier()->wait(pg->timeout());
  } catch (const ddp::Error& e) {
    std::cerr << "message_passing: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
