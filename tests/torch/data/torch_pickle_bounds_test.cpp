// The torch.save pickle reader against crafted tensor geometry: sizes and strides come from
// untrusted bytes, so every product and sum over them must be checked, and a file that would
// overflow int64 must be a UsageError, never a wrapped bound that lets a view escape its
// storage.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/torch/snapshot/snapshot.hpp"
#include "ddp/torch/snapshot/torch_pickle.hpp"
#include "ddp/util/error.hpp"

namespace {

// Pickle protocol 2 for torch._utils._rebuild_tensor_v2(storage of 4 floats, offset, size,
// stride, False, OrderedDict()), as torch.save writes a tensor.
std::vector<uint8_t> tensor_pickle(int64_t offset, const std::vector<int64_t>& size,
                                   const std::vector<int64_t>& stride) {
  std::string p = "\x80\x02";
  auto str = [&](const std::string& s) {
    p += 'X';
    for (int i = 0; i < 4; ++i) p += static_cast<char>((s.size() >> (8 * i)) & 0xff);
    p += s;
  };
  auto int64 = [&](int64_t v) {  // LONG1 with 8 little-endian bytes: any int64
    p += "\x8a\x08";
    for (int i = 0; i < 8; ++i)
      p += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  };
  p += "ctorch._utils\n_rebuild_tensor_v2\n";
  p += '(';  // the argument tuple
  p += '(';  // the persistent id
  str("storage");
  p += "ctorch\nFloatStorage\n";
  str("0");
  str("cpu");
  int64(4);
  p += "tQ";  // TUPLE, BINPERSID
  int64(offset);
  p += '(';
  for (int64_t s : size) int64(s);
  p += 't';
  p += '(';
  for (int64_t s : stride) int64(s);
  p += 't';
  p += '\x89';  // NEWFALSE: requires_grad
  p += "ccollections\nOrderedDict\n)R";
  p += "tR.";
  return {p.begin(), p.end()};
}

c10::IValue parse(const std::vector<uint8_t>& pkl) {
  auto storages = [](const std::string&) { return std::vector<uint8_t>(16, 0); };
  return ddp::parse_torch_pickle(pkl.data(), pkl.size(), storages, "crafted.pt");
}

// The message a rejected geometry gives, or "" when it was accepted.
std::string rejection(const std::vector<uint8_t>& pkl) {
  try {
    parse(pkl);
    return "";
  } catch (const ddp::UsageError& e) {
    return e.what();
  } catch (const c10::Error& e) {
    return std::string("not a UsageError: ") + e.what_without_backtrace();
  } catch (const std::exception& e) {
    return std::string("not a UsageError: ") + e.what();
  }
}

TEST(TorchPickleBounds, WellFormedTensorParses) {
  auto v = parse(tensor_pickle(1, {3}, {1}));
  ASSERT_TRUE(v.isTensor());
  EXPECT_EQ(v.toTensor().sizes(), (std::vector<int64_t>{3}));
}

// (2^40 - 1) * 2^40 wraps to -2^40 in int64 and the second dimension adds 2^40 - 1: the old
// bound came out as -1, "inside" a 4-element storage.
TEST(TorchPickleBounds, SizeTimesStrideOverflowIsAUsageError) {
  const int64_t big = int64_t{1} << 40;
  const std::string why = rejection(tensor_pickle(0, {big, big}, {big, 1}));
  EXPECT_NE(why.find("crafted.pt"), std::string::npos) << why;
  EXPECT_NE(why.find("overflow"), std::string::npos) << why;
}

// Offset plus extent past int64's maximum.
TEST(TorchPickleBounds, OffsetPlusExtentOverflowIsAUsageError) {
  const int64_t max = INT64_MAX;
  const std::string why = rejection(tensor_pickle(max - 1, {3}, {1}));
  EXPECT_NE(why.find("crafted.pt"), std::string::npos) << why;
  EXPECT_TRUE(why.find("overflow") != std::string::npos ||
              why.find("exceeds its storage") != std::string::npos)
      << why;
}

// Sizes whose product (the element count) overflows int64, with stride 0 so that the last
// element addressed stays inside the storage.
TEST(TorchPickleBounds, ElementCountOverflowIsAUsageError) {
  const int64_t big = int64_t{1} << 40;
  const std::string why = rejection(tensor_pickle(0, {big, big}, {0, 0}));
  EXPECT_NE(why.find("crafted.pt"), std::string::npos) << why;
  EXPECT_NE(why.find("overflow"), std::string::npos) << why;
}

// A view past the end of its storage (no overflow involved) is still refused.
TEST(TorchPickleBounds, ViewPastTheStorageIsAUsageError) {
  const std::string why = rejection(tensor_pickle(2, {3}, {1}));
  EXPECT_NE(why.find("exceeds its storage"), std::string::npos) << why;
}

// A snapshot whose OPTIMIZER_STATE is a stride-0 view: 1 MiB of elements over a 1-byte
// storage (a crafted file could declare 2^62). Decoding must not materialize it.
TEST(TorchPickleBounds, StridedBlobInASnapshotIsAUsageError) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("MODEL_STATE", c10::Dict<std::string, torch::Tensor>());
  d.insert("EPOCHS_RUN", int64_t{1});
  d.insert("OPTIMIZER_STATE", torch::zeros({1}, torch::kUInt8).expand({int64_t{1} << 20}));
  const std::vector<char> zip = torch::pickle_save(d);
  try {
    ddp::decode_snapshot(zip, "crafted.pt");
    FAIL() << "decoded a strided OPTIMIZER_STATE";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("OPTIMIZER_STATE is a strided view"), std::string::npos)
        << e.what();
  }
}

}  // namespace
