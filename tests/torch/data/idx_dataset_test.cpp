// IDX parsing and the Fashion-MNIST loader: good files, truncation, wrong magic, gzip damage.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <fstream>

#include "ddp/torch/data/idx_dataset.hpp"
#include "ddp/torch/data/idx_format.hpp"
#include "ddp/util/error.hpp"

namespace {

const std::string kFashion = "/usr/share/datasets/fashion-mnist";

std::vector<uint8_t> idx_bytes(uint8_t type, std::vector<uint32_t> dims,
                               const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  }
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddp_idx_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string write_gz(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = dir_ + "/" + name;
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return path;
  }
  std::string write_plain(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return path;
  }
  std::string dir_;
};

TEST(IdxFormat, ParsesHeaderAndPayload) {
  auto b = idx_bytes(0x08, {2, 3}, {1, 2, 3, 4, 5, 6});
  auto a = ddp::parse_idx(b.data(), b.size(), "mem");
  EXPECT_EQ(a.type_code, 0x08);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.data, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
}

TEST(IdxFormat, ErrorsNameTheSourceAndTheProblem) {
  auto good = idx_bytes(0x08, {2, 3}, {1, 2, 3, 4, 5, 6});
  auto msg = message_of([&] { ddp::parse_idx(good.data(), good.size() - 1, "f.idx"); });
  EXPECT_NE(msg.find("f.idx"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("6 data bytes"), std::string::npos) << msg;

  auto bad_magic = good;
  bad_magic[0] = 0x1f;
  msg = message_of([&] { ddp::parse_idx(bad_magic.data(), bad_magic.size(), "g.idx"); });
  EXPECT_NE(msg.find("wrong magic number 0x1f000802"), std::string::npos) << msg;

  auto bad_type = idx_bytes(0x07, {1}, {0});
  msg = message_of([&] { ddp::parse_idx(bad_type.data(), bad_type.size(), "t"); });
  EXPECT_NE(msg.find("unknown element type 0x07"), std::string::npos) << msg;

  auto trailing = idx_bytes(0x08, {2}, {1, 2, 3});
  msg = message_of([&] { ddp::parse_idx(trailing.data(), trailing.size(), "t"); });
  EXPECT_NE(msg.find("1 unexpected trailing bytes"), std::string::npos) << msg;

  auto huge = idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF}, {});
  msg = message_of([&] { ddp::parse_idx(huge.data(), huge.size(), "t"); });
  EXPECT_NE(msg.find("declared size exceeds"), std::string::npos) << msg;
  auto big = idx_bytes(0x08, {1001, 1000}, {});
  msg = message_of([&] { ddp::parse_idx(big.data(), big.size(), "t", 1000000); });
  EXPECT_NE(msg.find("declared size exceeds"), std::string::npos) << msg;

  msg = message_of([&] { ddp::parse_idx(good.data(), 6, "short"); });
  EXPECT_NE(msg.find("truncated header"), std::string::npos) << msg;
}

TEST(IdxFormat, NoPrefixOfAValidFileParses) {
  auto b = idx_bytes(0x0B, {3, 2}, std::vector<uint8_t>(12, 7));
  for (size_t n = 0; n < b.size(); ++n) {
    EXPECT_THROW(ddp::parse_idx(b.data(), n, "prefix"), ddp::UsageError) << n;
  }
  EXPECT_NO_THROW(ddp::parse_idx(b.data(), b.size(), "whole"));
}

TEST_F(TempDir, ReadsGzipAndPlainFiles) {
  auto b = idx_bytes(0x08, {4}, {9, 8, 7, 6});
  EXPECT_EQ(ddp::read_idx_file(write_gz("a.gz", b)).data, (std::vector<uint8_t>{9, 8, 7, 6}));
  EXPECT_EQ(ddp::read_idx_file(write_plain("a", b)).data, (std::vector<uint8_t>{9, 8, 7, 6}));
}

TEST_F(TempDir, TruncatedGzipIsAClearError) {
  std::vector<uint8_t> payload(5000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 31);
  const std::string full = write_gz("full.gz", idx_bytes(0x08, {5000}, payload));
  std::ifstream in(full, std::ios::binary);
  std::vector<uint8_t> gz((std::istreambuf_iterator<char>(in)), {});
  const std::string cut = write_plain("cut-labels-idx1-ubyte.gz",
                                      std::vector<uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
  auto msg = message_of([&] { ddp::read_idx_file(cut); });
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST_F(TempDir, MissingFileNamesPathAndPackage) {
  auto msg = message_of([&] { ddp::read_idx_file(dir_ + "/nope.gz"); });
  EXPECT_NE(msg.find("nope.gz: cannot open"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
}

TEST_F(TempDir, LoaderChecksImagesAgainstLabels) {
  std::vector<uint8_t> pixels(3 * 2 * 2, 255);
  pixels[0] = 0;
  write_gz("train-images-idx3-ubyte.gz", idx_bytes(0x08, {3, 2, 2}, pixels));
  write_gz("train-labels-idx1-ubyte.gz", idx_bytes(0x08, {3}, {1, 2, 9}));
  auto ds = ddp::load_mnist(ddp::MnistOptions().directory(dir_));
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.data().sizes(), (std::vector<int64_t>{3, 1, 2, 2}));
  EXPECT_EQ(ds.target().dtype(), torch::kLong);
  EXPECT_EQ(ds.target()[2].item<int64_t>(), 9);
  // ToTensor then Normalize((0.1307,), (0.3081,)), in float32 like torchvision.
  const float black = (0.0f - 0.1307f) / 0.3081f, white = (1.0f - 0.1307f) / 0.3081f;
  EXPECT_FLOAT_EQ(ds.data()[0][0][0][0].item<float>(), black);
  EXPECT_FLOAT_EQ(ds.data()[0][0][0][1].item<float>(), white);

  write_gz("t10k-images-idx3-ubyte.gz", idx_bytes(0x08, {3, 2, 2}, pixels));
  write_gz("t10k-labels-idx1-ubyte.gz", idx_bytes(0x08, {2}, {1, 2}));
  auto msg = message_of(
      [&] { ddp::load_mnist(ddp::MnistOptions().directory(dir_).split(ddp::MnistSplit::kTest)); });
  EXPECT_NE(msg.find("holds 3 images but"), std::string::npos) << msg;

  // Labels where images belong: the dimension check names the likely mix-up.
  write_gz("t10k-images-idx3-ubyte.gz", idx_bytes(0x08, {2}, {1, 2}));
  msg = message_of(
      [&] { ddp::load_mnist(ddp::MnistOptions().directory(dir_).split(ddp::MnistSplit::kTest)); });
  EXPECT_NE(msg.find("is this a labels file?"), std::string::npos) << msg;
}

TEST(FashionMnist, LoadsDebianDataset) {
  struct stat st {};
  if (::stat((kFashion + "/t10k-labels-idx1-ubyte.gz").c_str(), &st) != 0) {
    GTEST_SKIP() << kFashion << " is absent (install dataset-fashion-mnist)";
  }
  auto test = ddp::load_mnist(ddp::MnistOptions().split(ddp::MnistSplit::kTest));
  ASSERT_EQ(test.size(), 10000);
  EXPECT_EQ(test.data().sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  // Fashion-MNIST's test split is balanced: 1000 of each of the 10 classes.
  auto counts = torch::bincount(test.target());
  ASSERT_EQ(counts.numel(), 10);
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c].item<int64_t>(), 1000);
  EXPECT_GE(test.data().min().item<float>(), (0.0f - 0.1307f) / 0.3081f - 1e-6f);
  EXPECT_LE(test.data().max().item<float>(), (1.0f - 0.1307f) / 0.3081f + 1e-6f);
}

}  // namespace
