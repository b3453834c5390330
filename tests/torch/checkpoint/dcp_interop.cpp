// The C++ side of dcp_interop_test.py.
//
//   dcp_interop write DIR WORLD     WORLD ranks (threads) train make_model(0.2) with Adam
//                                   (ZeroRedundancyOptimizer when WORLD > 1) for 3 steps and
//                                   save a checkpoint in DIR; DIR/expected.pt gets the values
//                                   Python must read back ({key: tensor or float}).
//   dcp_interop read DIR EXPECTED   loads DIR (written by PyTorch) into make_model's shape and an
//                                   Adam; exits 1 naming every entry that differs from EXPECTED.
//   dcp_interop read-tensor DIR EXPECTED
//                                   loads a module with one parameter "w" (EXPECTED's shape).
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "../ddp/rank_threads.hpp"
#include "checkpoint_test_util.hpp"
#include "ddp/torch/checkpoint/checkpoint.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/torch/snapshot/torch_pickle.hpp"
#include "ddp/torch/snapshot/torch_save.hpp"

namespace {

using namespace ddp;

const torch::optim::AdamParamState& adam_state(torch::optim::Optimizer& o, const torch::Tensor& p) {
  return static_cast<const torch::optim::AdamParamState&>(*o.state().at(p.unsafeGetTensorImpl()));
}

int write(const std::string& dir, int world) {
  // An unsharded twin gives the expected values (ZeRO's equal them: every rank sees the same
  // gradients).
  auto twin = test::make_model(0.2);
  torch::optim::Adam twin_adam(twin->parameters(), torch::optim::AdamOptions(0.05));
  for (int s = 0; s < 3; ++s) {
    test::set_grads(*twin, s);
    twin_adam.step();
  }
  test::run_ranks(world, [&](int, ProcessGroupPtr pg) {
    auto model = test::make_model(0.2);
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (world > 1) {
      opt = std::make_unique<ZeroRedundancyOptimizer<torch::optim::Adam>>(
          model->parameters(), torch::optim::AdamOptions(0.05), pg);
    } else {
      opt = std::make_unique<torch::optim::Adam>(model->parameters(),
                                                 torch::optim::AdamOptions(0.05));
    }
    for (int s = 0; s < 3; ++s) {
      test::set_grads(*model, s);
      opt->step();
    }
    Checkpointer ckpt(CheckpointOptions(dir), pg);
    ckpt.save({3, 1, 3}, *model, opt.get(), {{"note", std::string("from ddp")}});
    ckpt.wait();
  });
  c10::impl::GenericDict expected(c10::StringType::get(), c10::AnyType::get());
  for (const auto& p : twin->named_parameters()) {
    expected.insert("model." + p.key(), p.value().detach());
    const auto& st = adam_state(twin_adam, p.value());
    expected.insert("optim.state." + p.key() + ".exp_avg", st.exp_avg());
    expected.insert("optim.state." + p.key() + ".exp_avg_sq", st.exp_avg_sq());
    expected.insert("optim.state." + p.key() + ".step", static_cast<double>(st.step()));
  }
  expected.insert("optim.param_groups.0.lr", 0.05);
  const auto bytes = torch_save_bytes(expected);
  std::ofstream(dir + "/expected.pt", std::ios::binary).write(bytes.data(), bytes.size());
  return 0;
}

c10::impl::GenericDict read_expected(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch_load_bytes(bytes, path).toGenericDict();
}

int compare(const std::string& what, const torch::Tensor& got, const c10::IValue& want) {
  if (torch::equal(got.to(torch::kFloat32), want.toTensor().to(torch::kFloat32))) return 0;
  std::cerr << what << " differs\n";
  return 1;
}

int read(const std::string& dir, const std::string& expected_path) {
  auto expected = read_expected(expected_path);
  auto model = test::make_model(7.0);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.9));
  auto r = Checkpointer::load(dir, model.get(), &adam, 0);
  int bad = 0;
  for (const auto& p : model->named_parameters()) {
    bad += compare("model." + p.key(), p.value(), expected.at("model." + p.key()));
    const auto& st = adam_state(adam, p.value());
    bad += compare(p.key() + " exp_avg", st.exp_avg(),
                   expected.at("optim.state." + p.key() + ".exp_avg"));
    bad += compare(p.key() + " exp_avg_sq", st.exp_avg_sq(),
                   expected.at("optim.state." + p.key() + ".exp_avg_sq"));
    const double step = expected.at("optim.state." + p.key() + ".step").toDouble();
    if (st.step() != static_cast<int64_t>(step)) {
      std::cerr << p.key() << " step " << st.step() << ", expected " << step << "\n";
      ++bad;
    }
  }
  const double lr =
      static_cast<const torch::optim::AdamOptions&>(adam.param_groups()[0].options()).lr();
  if (lr != expected.at("optim.param_groups.0.lr").toDouble()) {
    std::cerr << "lr " << lr << "\n";
    ++bad;
  }
  std::cout << (bad ? "MISMATCH" : "ddp read PyTorch's checkpoint: OK") << "\n";
  return bad ? 1 : 0;
}

int read_tensor(const std::string& dir, const std::string& expected_path) {
  auto expected = read_expected(expected_path).at("model.w").toTensor();
  torch::nn::Module m;
  auto w = m.register_parameter("w", torch::zeros_like(expected));
  Checkpointer::load(dir, &m, nullptr, 0);
  if (!torch::equal(w, expected)) {
    std::cerr << "w differs\n";
    return 1;
  }
  std::cout << "ddp assembled the chunked tensor: OK\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 4) return write(argv[2], std::stoi(argv[3]));
    if (mode == "read" && argc == 4) return read(argv[2], argv[3]);
    if (mode == "read-tensor" && argc == 4) return read_tensor(argv[2], argv[3]);
    std::cerr << "usage: dcp_interop write DIR WORLD | read DIR EXPECTED | read-tensor DIR "
                 "EXPECTED\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dcp_interop: " << e.what() << "\n";
    return 1;
  }
}
