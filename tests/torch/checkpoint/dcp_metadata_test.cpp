// DCP's .metadata: what encode writes decodes to the same entries, and bytes that are not a
// metadata file (truncated, flipped, garbage) end in a UsageError naming the file, never a
// crash or a hang.
#include <gtest/gtest.h>

#include <random>

#include "dcp_metadata.hpp"
#include "ddp/util/error.hpp"

namespace ddp::dcp {
namespace {

Metadata sample() {
  Metadata md;
  md.save_id = "test";
  Entry w;
  w.fqn = "model.fc.weight";
  w.is_tensor = true;
  w.dtype = "bfloat16";
  w.size = {4, 3};
  w.path = {std::string("model"), std::string("fc.weight")};
  for (int64_t r = 0; r < 2; ++r) {
    Chunk c;
    c.offsets = {2 * r, 0};
    c.sizes = {2, 3};
    c.storage = {"__" + std::to_string(r) + "_0.distcp", 100 * r, 77 + r};
    w.chunks.push_back(c);
  }
  md.entries.push_back(w);
  Entry lr;
  lr.fqn = "optim.param_groups.0.lr";
  lr.bytes = {"__0_0.distcp", 5000000000LL, 9};
  lr.path = {std::string("optim"), std::string("param_groups"), int64_t{0}, std::string("lr")};
  md.entries.push_back(lr);
  Entry scalar;
  scalar.fqn = "step";
  scalar.is_tensor = true;
  scalar.dtype = "float32";
  scalar.chunks.push_back({{}, {}, {"__1_0.distcp", 0, 10}});
  md.entries.push_back(scalar);
  return md;
}

TEST(DcpMetadata, EncodeThenDecodeGivesTheSameEntries) {
  const Metadata md = sample();
  const Metadata back = decode(encode(md), "test");
  ASSERT_EQ(back.entries.size(), md.entries.size());
  for (size_t i = 0; i < md.entries.size(); ++i) {
    const Entry &a = md.entries[i], &b = back.entries[i];
    EXPECT_EQ(a.fqn, b.fqn);
    EXPECT_EQ(a.is_tensor, b.is_tensor);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.size, b.size);
    // An entry without a path is a top-level key: its path is the key itself.
    EXPECT_EQ(b.path, a.path.empty() ? std::vector<PathPart>{a.fqn} : a.path);
    ASSERT_EQ(a.chunks.size(), b.chunks.size());
    for (size_t c = 0; c < a.chunks.size(); ++c) {
      EXPECT_EQ(a.chunks[c].offsets, b.chunks[c].offsets);
      EXPECT_EQ(a.chunks[c].sizes, b.chunks[c].sizes);
      EXPECT_EQ(a.chunks[c].storage.relative_path, b.chunks[c].storage.relative_path);
      EXPECT_EQ(a.chunks[c].storage.offset, b.chunks[c].storage.offset);
      EXPECT_EQ(a.chunks[c].storage.length, b.chunks[c].storage.length);
    }
    EXPECT_EQ(a.bytes.offset, b.bytes.offset);
    EXPECT_EQ(a.bytes.length, b.bytes.length);
  }
  EXPECT_EQ(back.version, "1.0.0");
}

TEST(DcpMetadata, AStoragePathLeavingTheDirectoryIsRefused) {
  Metadata md = sample();
  md.entries[1].bytes.relative_path = "../../etc/passwd";
  try {
    decode(encode(md), "evil/.metadata");
    FAIL() << "accepted a path outside the checkpoint";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not a file of the checkpoint directory"),
              std::string::npos)
        << e.what();
  }
}

TEST(DcpMetadata, DamagedBytesAreAUsageErrorNamingTheFile) {
  const std::string good = encode(sample());
  std::mt19937 rng(7);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bad = good;
    if (i % 3 == 0) {
      bad.resize(rng() % good.size());
    } else {
      for (int k = 0; k < 1 + i % 4; ++k) bad[rng() % bad.size()] = static_cast<char>(rng());
    }
    try {
      decode(bad, "damaged/.metadata");
    } catch (const UsageError& e) {
      ++refused;
      ASSERT_NE(std::string(e.what()).find("damaged/.metadata"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(refused, 1000);  // most damage is detected; the rest decoded to some metadata
}

}  // namespace
}  // namespace ddp::dcp
