// FusedAdam against torch::optim::Adam: the same parameters, moments and saved state after
// steps on identical gradients, for every AdamOptions setting, on both of FusedAdam's paths
// (the fused float32 kernel and the tensor operations it falls back to).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include "ddp/torch/optim/fused_adam.hpp"
#include "ddp/torch/optim/optimizer_state_key.hpp"

namespace {

using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;

// Parameters of several shapes; the largest spans several of FusedAdam's per-thread chunks.
std::vector<torch::Tensor> make_params(torch::Dtype dtype = torch::kFloat32) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> out;
  for (auto shape : std::vector<std::vector<int64_t>>{{300000}, {1000, 37}, {3, 4, 5}, {7}}) {
    out.push_back(torch::randn(shape, torch::TensorOptions().dtype(dtype)).requires_grad_());
  }
  return out;
}

std::vector<torch::Tensor> clone_params(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Gives both parameter sets the same fresh gradients, then steps both optimizers.
// The gradients' magnitudes lie in [0.1, 0.2] (times i + 1), so the weight decays used here
// (0.1 at most, on parameters drawn from N(0, 1)) never cancel them: Adam's first update of an
// element is lr * sign(g + weight_decay * p), and where that sum is within rounding of zero two
// correct implementations may step in opposite directions.
void step_both(std::vector<torch::Tensor>& a, torch::optim::Optimizer& opt_a,
               std::vector<torch::Tensor>& b, torch::optim::Optimizer& opt_b, int step) {
  torch::manual_seed(1000 + step);
  for (size_t i = 0; i < a.size(); ++i) {
    auto magnitude = (torch::rand_like(a[i]) + 1) * (0.1 * static_cast<double>(i + 1));
    auto g = magnitude * torch::sign(torch::randn_like(a[i]));
    a[i].mutable_grad() = g.clone();
    b[i].mutable_grad() = g.clone();
  }
  opt_a.step();
  opt_b.step();
}

void expect_close(const torch::Tensor& expected, const torch::Tensor& actual,
                  const std::string& what) {
  ASSERT_EQ(expected.sizes(), actual.sizes()) << what;
  const double scale = expected.abs().max().item<double>();
  const double error = (expected - actual).abs().max().item<double>();
  // A few float32 ulp per step, relative to the tensor's magnitude.
  EXPECT_LE(error, 1e-6 * scale + 1e-12) << what << ": max abs error " << error;
}

void expect_same_state(const std::vector<torch::Tensor>& expected, const Adam& expected_opt,
                       const std::vector<torch::Tensor>& actual, const Adam& actual_opt) {
  for (size_t i = 0; i < expected.size(); ++i) {
    const std::string name = "parameter " + std::to_string(i);
    expect_close(expected[i], actual[i], name);
    const auto& se = static_cast<const AdamParamState&>(
        *expected_opt.state().at(ddp::optimizer_state_key(expected[i])));
    const auto& sa = static_cast<const AdamParamState&>(
        *actual_opt.state().at(ddp::optimizer_state_key(actual[i])));
    EXPECT_EQ(se.step(), sa.step()) << name;
    expect_close(se.exp_avg(), sa.exp_avg(), name + " exp_avg");
    expect_close(se.exp_avg_sq(), sa.exp_avg_sq(), name + " exp_avg_sq");
    if (se.max_exp_avg_sq().defined()) {
      expect_close(se.max_exp_avg_sq(), sa.max_exp_avg_sq(), name + " max_exp_avg_sq");
    }
  }
}

struct Case {
  std::string name;
  AdamOptions options;
};

class FusedAdamOptions : public ::testing::TestWithParam<Case> {};

TEST_P(FusedAdamOptions, MatchesTorchAdamOverTwelveSteps) {
  auto expected = make_params();
  auto actual = clone_params(expected);
  Adam reference(expected, GetParam().options);
  ddp::FusedAdam fused(actual, GetParam().options);
  for (int step = 0; step < 12; ++step) step_both(expected, reference, actual, fused, step);
  EXPECT_EQ(fused.last_step_paths().fused, 4);
  EXPECT_EQ(fused.last_step_paths().unfused, 0);
  expect_same_state(expected, reference, actual, fused);
}

INSTANTIATE_TEST_SUITE_P(
    AdamOptions, FusedAdamOptions,
    ::testing::Values(Case{"defaults", AdamOptions(1e-3)},
                      Case{"weight_decay", AdamOptions(1e-2).weight_decay(0.02)},
                      Case{"amsgrad", AdamOptions(1e-2).amsgrad(true)},
                      Case{"betas_eps", AdamOptions(3e-3).betas({0.8, 0.99}).eps(1e-4)},
                      Case{"all",
                           AdamOptions(1e-2).betas({0.5, 0.9}).weight_decay(0.02).amsgrad(true)}),
    [](const auto& info) { return info.param.name; });

TEST(FusedAdam, SplitsLargeParametersOverIntraOpThreads) {
  const int threads = torch::get_num_threads();
  torch::set_num_threads(2);
  auto expected = make_params();
  auto actual = clone_params(expected);
  Adam reference(expected, AdamOptions(1e-2));
  ddp::FusedAdam fused(actual, AdamOptions(1e-2));
  for (int step = 0; step < 4; ++step) step_both(expected, reference, actual, fused, step);
  torch::set_num_threads(threads);
  expect_same_state(expected, reference, actual, fused);
}

TEST(FusedAdam, ParameterGroupsKeepTheirOwnOptions) {
  auto expected = make_params();
  auto actual = clone_params(expected);
  auto groups = [](const std::vector<torch::Tensor>& p) {
    return std::vector<torch::optim::OptimizerParamGroup>{
        torch::optim::OptimizerParamGroup({p[0], p[1]}, std::make_unique<AdamOptions>(1e-2)),
        torch::optim::OptimizerParamGroup(
            {p[2], p[3]}, std::make_unique<AdamOptions>(AdamOptions(1e-1).amsgrad(true)))};
  };
  Adam reference(groups(expected));
  ddp::FusedAdam fused(groups(actual));
  for (int step = 0; step < 5; ++step) step_both(expected, reference, actual, fused, step);
  expect_same_state(expected, reference, actual, fused);
}

// float64 parameters and a float32 parameter whose gradient is a transposed view take the
// tensor-operation path.
TEST(FusedAdam, OtherDtypesAndLayoutsMatchTorchAdamToo) {
  auto expected = make_params(torch::kFloat64);
  auto actual = clone_params(expected);
  Adam reference(expected, AdamOptions(1e-2).amsgrad(true));
  ddp::FusedAdam fused(actual, AdamOptions(1e-2).amsgrad(true));
  for (int step = 0; step < 5; ++step) step_both(expected, reference, actual, fused, step);
  EXPECT_EQ(fused.last_step_paths().fused, 0);
  EXPECT_EQ(fused.last_step_paths().unfused, 4);
  expect_same_state(expected, reference, actual, fused);

  auto square = torch::randn({64, 64}).requires_grad_();
  auto square_copy = square.detach().clone().requires_grad_();
  Adam square_reference({square}, AdamOptions(1e-2));
  ddp::FusedAdam square_fused({square_copy}, AdamOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    auto g = torch::randn({64, 64}).t();  // not contiguous
    square.mutable_grad() = g.clone();    // clone keeps the transposed strides
    square_copy.mutable_grad() = g.clone();
    ASSERT_FALSE(square_copy.grad().is_contiguous());
    square_reference.step();
    square_fused.step();
    EXPECT_EQ(square_fused.last_step_paths().unfused, 1);
  }
  expect_close(square, square_copy, "transposed-gradient parameter");
}

TEST(FusedAdam, LeavesParametersWithoutGradientAlone) {
  auto params = make_params();
  const auto untouched = params[2].detach().clone();
  ddp::FusedAdam fused(params, AdamOptions(1e-2));
  for (size_t i = 0; i < params.size(); ++i) {
    if (i != 2) params[i].mutable_grad() = torch::ones_like(params[i]);
  }
  fused.step();
  EXPECT_EQ(fused.last_step_paths().fused, static_cast<int64_t>(params.size()) - 1);
  EXPECT_TRUE(torch::equal(params[2], untouched));
  EXPECT_EQ(fused.state().count(ddp::optimizer_state_key(params[2])), 0u);
  EXPECT_EQ(fused.state().size(), params.size() - 1);
}

TEST(FusedAdam, ClosureRunsWithGradientsAndItsLossIsReturned) {
  auto w = torch::randn({10}).requires_grad_();
  ddp::FusedAdam fused({w}, AdamOptions(1e-2));
  const auto before = w.detach().clone();
  auto loss = fused.step([&] {
    fused.zero_grad();
    auto l = (w * w).sum();
    l.backward();
    return l;
  });
  EXPECT_NEAR(loss.item<double>(), (before * before).sum().item<double>(), 1e-4);
  EXPECT_FALSE(torch::equal(w, before));
}

// A state saved by one optimizer loads into the other, and training goes on as if it had never
// changed optimizer: the keys and the per-parameter state are torch::optim::Adam's.
template <typename From, typename To>
void expect_state_carries_over() {
  auto reference_params = make_params();
  auto from_params = clone_params(reference_params);
  Adam reference(reference_params, AdamOptions(1e-2).amsgrad(true));
  From from(from_params, AdamOptions(1e-2).amsgrad(true));
  for (int step = 0; step < 3; ++step) {
    step_both(reference_params, reference, from_params, from, step);
  }
  std::stringstream saved;
  torch::save(from, saved);
  auto to_params = clone_params(from_params);
  To to(to_params, AdamOptions(1e-2).amsgrad(true));
  torch::load(to, saved);
  for (int step = 3; step < 6; ++step) step_both(reference_params, reference, to_params, to, step);
  expect_same_state(reference_params, reference, to_params, to);
}

TEST(FusedAdam, StateSavedByTorchAdamLoadsIntoFusedAdam) {
  expect_state_carries_over<Adam, ddp::FusedAdam>();
}

TEST(FusedAdam, StateSavedByFusedAdamLoadsIntoTorchAdam) {
  expect_state_carries_over<ddp::FusedAdam, Adam>();
}

}  // namespace
