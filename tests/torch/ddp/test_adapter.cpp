// tensor_adapter: dtype mapping and the errors for tensors collectives cannot take.
#include <gtest/gtest.h>

#include "ddp/torch/ddp/state.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"

namespace {

TEST(TensorAdapter, MapsEverySupportedDtypeBothWays) {
  for (auto type : {torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16,
                    torch::kInt32, torch::kInt64, torch::kUInt8}) {
    auto dtype = ddp::to_data_type(type);
    ASSERT_TRUE(dtype.has_value()) << c10::toString(type);
    EXPECT_EQ(ddp::to_scalar_type(*dtype), type);
    EXPECT_EQ(ddp::element_size(*dtype), c10::elementSize(type));
  }
  EXPECT_FALSE(ddp::to_data_type(torch::kBool).has_value());
  EXPECT_FALSE(ddp::to_data_type(torch::kComplexFloat).has_value());
}

TEST(TensorAdapter, BufferOfContiguousTensorCoversItsStorage) {
  auto t = torch::arange(12, torch::kFloat64).reshape({3, 4});
  auto slice = t.narrow(0, 1, 2);  // rows 1..2: contiguous, offset storage
  auto b = ddp::tensor_buffer(slice, "slice");
  EXPECT_EQ(b.count, 8u);
  EXPECT_EQ(b.dtype, ddp::DataType::kFloat64);
  EXPECT_EQ(static_cast<double*>(b.data)[0], 4.0);
}

TEST(TensorAdapter, NonContiguousTensorIsAUsageErrorNamingTheFix) {
  auto t = torch::zeros({4, 3}).t();
  try {
    ddp::tensor_buffer(t, "parameter 'w'");
    FAIL() << "expected UsageError";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(".contiguous()"), std::string::npos) << e.what();
  }
}

TEST(TensorAdapter, UnsupportedDtypeIsAUsageErrorNamingTheDtype) {
  try {
    ddp::tensor_buffer(torch::zeros({2}, torch::kBool), "mask");
    FAIL() << "expected UsageError";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("Bool"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("mask"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ddp::tensor_buffer(torch::Tensor(), "x"), ddp::UsageError);
  EXPECT_THROW(ddp::tensor_buffer(torch::zeros({2, 2}).to_sparse(), "x"), ddp::UsageError);
}

TEST(StateDict, LoadRejectsMissingKeysAndWrongShapes) {
  torch::nn::Linear a(3, 2), b(3, 2), c(3, 4);
  auto state = ddp::state_dict(*a);
  ASSERT_EQ(state.size(), 2u);
  EXPECT_TRUE(state.contains("weight") && state.contains("bias"));
  ddp::load_state_dict(*b, state);
  EXPECT_TRUE(torch::equal(a->weight, b->weight));
  EXPECT_THROW(ddp::load_state_dict(*c, state), ddp::UsageError);
  ddp::StateDict partial;
  partial.insert("weight", a->weight);
  EXPECT_THROW(ddp::load_state_dict(*b, partial), ddp::UsageError);
  ddp::load_state_dict(*b, partial, /*strict=*/false);
}

}  // namespace
