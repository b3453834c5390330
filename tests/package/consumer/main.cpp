// A trainer written against the installed ddp (one header, one CMake target): trains a
// Linear(20, 1) with DDP for a few steps on every rank, then checks that every rank ends with
// the same parameters (DDP's contract) and prints one line per rank that the test reads.
// `consumer SNAPSHOT`: rank 0 also saves a ddp snapshot of the trained model there (a file that
// Python's torch.load reads: tests/package/bare_root_test.sh loads it).
#include <ddp/ddp.hpp>

#include <iostream>

int main(int argc, char** argv) {
  try {
    auto pg = ddp::init_process_group(ddp::InitOptions{});
    auto dataset = ddp::make_synthetic_dataset(ddp::SyntheticOptions().size(256).seed(1));
    torch::manual_seed(pg->rank() + 7);  // different on purpose: DDP's broadcast aligns them
    torch::nn::Linear net(20, 1);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
    ddp::DistributedDataParallel model(net, pg);
    ddp::DistributedSampler sampler(dataset.size(),
                                    ddp::DistributedSamplerOptions(pg->size(), pg->rank()));
    ddp::PrefetchLoader loader(dataset, sampler.indices(),
                               ddp::PrefetchLoaderOptions().batch_size(16));
    int steps = 0;
    while (auto batch = loader.next()) {
      optimizer.zero_grad();
      torch::mse_loss(model(batch->data), batch->target).backward();
      model.step(optimizer);
      ++steps;
    }
    // Every rank's parameters, summed over ranks, must equal world_size times its own.
    auto flat = torch::cat({net->weight.detach().flatten(), net->bias.detach()}).contiguous();
    auto sum = flat.clone();
    pg->all_reduce(sum.data_ptr<float>(), sum.numel(), ddp::DataType::kFloat32, ddp::ReduceOp::kSum)
        ->wait(pg->timeout());
    const bool equal = torch::allclose(sum, flat * pg->size(), 1e-6, 1e-6);
    if (argc > 1 && pg->rank() == 0) {
      const auto file =
          ddp::SnapshotManager(ddp::SnapshotOptions(argv[1]).keep(1))
              .save(ddp::capture_snapshot(*net, &optimizer, /*epochs_run=*/1, /*sampler_epoch=*/1));
      std::cout << "consumer rank 0: snapshot saved to " << file << std::endl;
    }
    std::cout << "consumer rank " << pg->rank() << " of " << pg->size() << ": ddp " << ddp::kVersion
              << ", " << steps << " steps, parameters " << (equal ? "equal" : "DIFFER")
              << " across ranks" << std::endl;
    return equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << std::endl;
    return 1;
  }
}
