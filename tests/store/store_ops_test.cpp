// Every Store operation, run against every backend: HashStore, TcpStore, PrefixStore (over
// TcpStore and over HashStore) and FileStore. The semantics are c10d's.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "ddp/store/file_store.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/prefix_store.hpp"
#include "ddp/util/error.hpp"
#include "store_test_util.hpp"

namespace ddp::test {
namespace {

// A store under test plus whatever keeps it alive (server, temp dir). second_client() is
// another handle on the same data, as a different rank would hold.
struct Harness {
  virtual ~Harness() = default;
  virtual Store& store() = 0;
  virtual std::shared_ptr<Store> second_client() = 0;
};

struct HashHarness : Harness {
  std::shared_ptr<HashStore> hash = std::make_shared<HashStore>();
  Store& store() override { return *hash; }
  std::shared_ptr<Store> second_client() override { return hash; }
};

struct TcpHarness : Harness {
  std::unique_ptr<TcpStoreServer> server = start_server();
  TcpStore client{client_options(server->port())};
  Store& store() override { return client; }
  std::shared_ptr<Store> second_client() override {
    return std::make_shared<TcpStore>(client_options(server->port()));
  }
};

struct PrefixTcpHarness : Harness {
  std::unique_ptr<TcpStoreServer> server = start_server();
  PrefixStore prefix{"job", std::make_shared<TcpStore>(client_options(server->port()))};
  Store& store() override { return prefix; }
  std::shared_ptr<Store> second_client() override {
    return std::make_shared<PrefixStore>(
        "job", std::make_shared<TcpStore>(client_options(server->port())));
  }
};

struct PrefixHashHarness : Harness {
  std::shared_ptr<HashStore> hash = std::make_shared<HashStore>();
  PrefixStore prefix{"job", hash};
  Store& store() override { return prefix; }
  std::shared_ptr<Store> second_client() override {
    return std::make_shared<PrefixStore>("job", hash);
  }
};

struct FileHarness : Harness {
  TempDir dir;
  FileStore file{dir.file("store"), std::chrono::seconds(10)};
  Store& store() override { return file; }
  std::shared_ptr<Store> second_client() override {
    return std::make_shared<FileStore>(dir.file("store"), std::chrono::seconds(10));
  }
};

struct Backend {
  std::string name;
  std::function<std::unique_ptr<Harness>()> make;
};

class StoreOpsTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    harness_ = GetParam().make();
    harness_->store().set_timeout(10s);
  }
  Store& store() { return harness_->store(); }
  std::unique_ptr<Harness> harness_;
};

TEST_P(StoreOpsTest, SetThenGetReturnsTheBytes) {
  std::string binary("a\0b\xff", 4);
  store().set("k", binary);
  EXPECT_EQ(store().get("k"), binary);
  store().set("k", "second");
  EXPECT_EQ(store().get("k"), "second");
  store().set("empty", "");
  EXPECT_EQ(store().get("empty"), "");
}

TEST_P(StoreOpsTest, AddCountsFromZeroAndStoresDecimalText) {
  EXPECT_EQ(store().add("counter", 5), 5);
  EXPECT_EQ(store().add("counter", -7), -2);
  EXPECT_EQ(store().get("counter"), "-2");
  store().set("text", "not a number");
  EXPECT_THROW(store().add("text", 1), StoreError);
}

TEST_P(StoreOpsTest, CompareSetFollowsC10dSemantics) {
  // Absent key and empty expected: sets.
  EXPECT_EQ(store().compare_set("k", "", "v1"), "v1");
  // Matching expected: swaps.
  EXPECT_EQ(store().compare_set("k", "v1", "v2"), "v2");
  // Mismatch: unchanged, returns the current value.
  EXPECT_EQ(store().compare_set("k", "nope", "v3"), "v2");
  EXPECT_EQ(store().get("k"), "v2");
  // Absent key and non-empty expected: stays absent, returns expected.
  EXPECT_EQ(store().compare_set("absent", "x", "y"), "x");
  EXPECT_FALSE(store().check({"absent"}));
}

TEST_P(StoreOpsTest, DeleteKeyReportsWhetherItExisted) {
  store().set("k", "v");
  EXPECT_TRUE(store().delete_key("k"));
  EXPECT_FALSE(store().delete_key("k"));
  EXPECT_FALSE(store().check({"k"}));
}

TEST_P(StoreOpsTest, NumKeysCountsKeys) {
  int64_t before = store().num_keys();
  store().set("a", "1");
  store().set("b", "2");
  store().add("c", 1);
  EXPECT_EQ(store().num_keys(), before + 3);
  store().delete_key("a");
  EXPECT_EQ(store().num_keys(), before + 2);
}

TEST_P(StoreOpsTest, CheckIsTrueOnlyWhenAllKeysAreSet) {
  EXPECT_FALSE(store().check({"x"}));
  store().set("x", "1");
  EXPECT_TRUE(store().check({"x"}));
  EXPECT_FALSE(store().check({"x", "y"}));
  EXPECT_TRUE(store().check({}));
}

TEST_P(StoreOpsTest, MultiSetAndMultiGetKeepOrder) {
  store().multi_set({"m1", "m2", "m3"}, {"one", "two", "three"});
  EXPECT_EQ(store().multi_get({"m3", "m1", "m2"}),
            (std::vector<std::string>{"three", "one", "two"}));
  EXPECT_THROW(store().multi_set({"a", "b"}, {"only one"}), UsageError);
}

TEST_P(StoreOpsTest, WaitReturnsOnceKeysAreSetByAnotherClient) {
  auto other = harness_->second_client();
  std::thread setter([&] {
    other->set("w1", "1");
    other->set("w2", "2");
  });
  store().wait({"w1", "w2"}, 10s);
  setter.join();
  EXPECT_TRUE(store().check({"w1", "w2"}));
}

TEST_P(StoreOpsTest, GetBlocksUntilAnotherClientSets) {
  auto other = harness_->second_client();
  std::string got;
  std::thread getter([&] { got = store().get("late"); });
  // The getter may or may not be parked yet; either way it must see the value.
  other->set("late", "value");
  getter.join();
  EXPECT_EQ(got, "value");
}

TEST_P(StoreOpsTest, WaitTimesOutNamingTheMissingKeyAndLimit) {
  store().set("present", "1");
  try {
    store().wait({"present", "missing-key"}, 50ms);
    FAIL() << "wait returned without the key";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("missing-key"), std::string::npos) << what;
    EXPECT_NE(what.find("limit 50 ms"), std::string::npos) << what;
  }
}

TEST_P(StoreOpsTest, GetTimesOutWithTheStoreTimeout) {
  store().set_timeout(50ms);
  EXPECT_THROW(store().get("never"), TimeoutError);
}

TEST_P(StoreOpsTest, SecondClientSeesTheSameData) {
  auto other = harness_->second_client();
  store().set("shared", "yes");
  EXPECT_EQ(other->get("shared"), "yes");
  EXPECT_EQ(other->add("n", 2), 2);
  EXPECT_EQ(store().add("n", 3), 5);
}

const Backend kBackends[] = {
    {"HashStore", [] { return std::unique_ptr<Harness>(new HashHarness); }},
    {"TcpStore", [] { return std::unique_ptr<Harness>(new TcpHarness); }},
    {"PrefixStoreOverTcp", [] { return std::unique_ptr<Harness>(new PrefixTcpHarness); }},
    {"PrefixStoreOverHash", [] { return std::unique_ptr<Harness>(new PrefixHashHarness); }},
    {"FileStore", [] { return std::unique_ptr<Harness>(new FileHarness); }},
};

INSTANTIATE_TEST_SUITE_P(AllBackends, StoreOpsTest, ::testing::ValuesIn(kBackends),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace ddp::test
