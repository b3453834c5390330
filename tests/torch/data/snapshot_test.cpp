// Snapshots: checksum, atomic replacement, keep-K, newest-valid resume, and both directions of
// the Python exchange (C++ -> torch.load, torch.save -> C++).
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "ddp/torch/snapshot/snapshot.hpp"
#include "ddp/torch/snapshot/snapshot_file.hpp"
#include "ddp/torch/snapshot/torch_pickle.hpp"
#include "ddp/util/error.hpp"
#include "python_helper.hpp"

namespace {

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddp_snap_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  ddp::Snapshot make(int64_t epochs, float fill) {
    torch::nn::Linear lin(20, 1);
    torch::NoGradGuard g;
    lin->weight.fill_(fill);
    lin->bias.fill_(-fill);
    return ddp::capture_snapshot(*lin, nullptr, epochs, epochs);
  }
  std::string dir_;
};

void flip_byte(const std::string& path, size_t pos) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(pos);
  char c;
  f.get(c);
  f.seekp(pos);
  f.put(static_cast<char>(c ^ 0x5a));
}

TEST_F(SnapshotTest, ChecksumDetectsEveryKindOfDamage) {
  auto bytes = ddp::encode_snapshot(make(3, 1.5f));
  std::string why;
  EXPECT_EQ(ddp::verify_zip_checksum(bytes, &why), ddp::ChecksumStatus::kValid) << why;

  auto flipped = bytes;
  flipped[bytes.size() / 2] ^= 1;
  EXPECT_EQ(ddp::verify_zip_checksum(flipped, &why), ddp::ChecksumStatus::kMismatch);
  EXPECT_NE(why.find("checksum mismatch"), std::string::npos) << why;

  for (size_t cut : {size_t{0}, size_t{10}, bytes.size() / 2, bytes.size() - 1}) {
    std::vector<char> truncated(bytes.begin(), bytes.begin() + cut);
    EXPECT_EQ(ddp::verify_zip_checksum(truncated), ddp::ChecksumStatus::kNotZip) << cut;
  }
  auto plain = torch::pickle_save(c10::IValue(int64_t{1}));
  EXPECT_EQ(ddp::verify_zip_checksum(plain), ddp::ChecksumStatus::kMissing);
}

TEST_F(SnapshotTest, RoundTripRestoresModelOptimizerAndRng) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3),
                            torch::nn::Linear(3, 1));
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  for (int i = 0; i < 3; ++i) {  // gives Adam state and BatchNorm running stats
    adam.zero_grad();
    net->forward(torch::randn({8, 4})).sum().backward();
    adam.step();
  }
  auto snap = ddp::capture_snapshot(*net, &adam, 7, 8);
  const auto after_capture = torch::rand({5});  // what the RNG gives next

  auto decoded = ddp::decode_snapshot(ddp::encode_snapshot(snap), "mem");
  EXPECT_EQ(decoded.epochs_run, 7);
  EXPECT_EQ(decoded.sampler_epoch, 8);

  torch::manual_seed(99);
  torch::nn::Sequential fresh(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3),
                              torch::nn::Linear(3, 1));
  torch::optim::Adam fresh_adam(fresh->parameters(), torch::optim::AdamOptions(1e-2));
  ddp::restore_snapshot(decoded, *fresh, &fresh_adam);
  EXPECT_TRUE(torch::equal(torch::rand({5}), after_capture));
  auto a = net->named_parameters(), b = fresh->named_parameters();
  for (const auto& p : a) EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  auto ab = net->named_buffers(), bb = fresh->named_buffers();
  for (const auto& p : ab) EXPECT_TRUE(torch::equal(p.value(), bb[p.key()])) << p.key();
  // Same optimizer state: one more identical step gives identical parameters.
  auto x = torch::randn({8, 4});
  for (auto* pair : {&adam, &fresh_adam}) pair->zero_grad();
  net->forward(x).sum().backward();
  fresh->forward(x).sum().backward();
  adam.step();
  fresh_adam.step();
  for (const auto& p : net->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), fresh->named_parameters()[p.key()])) << p.key();
  }
}

TEST_F(SnapshotTest, RestoreIsStrictAndNamesTheKeys) {
  torch::nn::Linear small(2, 1);
  auto snap = make(1, 1.0f);  // Linear(20, 1)
  try {
    ddp::restore_snapshot(snap, *small, nullptr);
    FAIL();
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("weight (snapshot [1, 20], model [1, 2])"),
              std::string::npos)
        << e.what();
  }
  torch::nn::Sequential other(torch::nn::Linear(20, 1));
  try {
    ddp::restore_snapshot(snap, *other, nullptr);
    FAIL();
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("missing keys [0.bias, 0.weight]"), std::string::npos)
        << e.what();
  }
}

TEST_F(SnapshotTest, KeepsNewestKAndLinksMainPath) {
  ddp::SnapshotManager mgr(ddp::SnapshotOptions(dir_ + "/snapshot.pt").keep(2));
  for (int e = 1; e <= 5; ++e) {
    EXPECT_EQ(mgr.save(make(e, static_cast<float>(e))), mgr.epoch_file(e));
  }
  auto files = mgr.epoch_files();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].first, 5);
  EXPECT_EQ(files[1].first, 4);
  EXPECT_EQ(files[0].second, dir_ + "/snapshot.epoch-000005.pt");
  auto main = ddp::decode_snapshot(ddp::read_whole_file(dir_ + "/snapshot.pt"), "main");
  EXPECT_EQ(main.epochs_run, 5);
  // No temporary files are left behind.
  EXPECT_EQ(std::system(("test -z \"$(ls -A " + dir_ + " | grep -v '^snapshot')\"").c_str()), 0);
}

TEST_F(SnapshotTest, ResumeSkipsDamagedNewerFilesAndSaysWhy) {
  ddp::SnapshotManager mgr(ddp::SnapshotOptions(dir_ + "/s.pt").keep(5));
  for (int e = 1; e <= 4; ++e) mgr.save(make(e, static_cast<float>(e)));
  // Epoch 4 (and the main path, its hard link) damaged in place; epoch 3 truncated.
  flip_byte(mgr.epoch_file(4), 100);
  ASSERT_EQ(::truncate(mgr.epoch_file(3).c_str(), 200), 0);

  auto r = mgr.load_newest_valid();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->snapshot.epochs_run, 2);
  EXPECT_EQ(r->path, mgr.epoch_file(2));
  EXPECT_NE(r->verification.find("verified"), std::string::npos);
  ASSERT_EQ(r->skipped.size(), 2u);
  EXPECT_NE(r->skipped[0].find("s.epoch-000004.pt: checksum mismatch"), std::string::npos)
      << r->skipped[0];
  EXPECT_NE(r->skipped[1].find("s.epoch-000003.pt: 200 bytes"), std::string::npos) << r->skipped[1];
}

TEST_F(SnapshotTest, NothingToResumeFrom) {
  ddp::SnapshotManager mgr(ddp::SnapshotOptions(dir_ + "/none.pt"));
  EXPECT_FALSE(mgr.load_newest_valid().has_value());
  EXPECT_THROW(ddp::SnapshotManager(ddp::SnapshotOptions(dir_ + "/x.pt").keep(0)), ddp::UsageError);
}

// A writer killed with SIGKILL at random moments never leaves an unreadable snapshot behind.
TEST_F(SnapshotTest, KillDuringWritesNeverLeavesAnUnreadableSnapshot) {
  const std::string path = dir_ + "/k.pt";
  ddp::SnapshotManager(ddp::SnapshotOptions(path).keep(2)).save(make(0, 0.0f));
  std::mt19937 rng(12345);
  for (int round = 0; round < 8; ++round) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ddp::SnapshotManager mgr(ddp::SnapshotOptions(path).keep(2));
      // Large enough (4 MB) that a kill often lands inside a write.
      torch::nn::Linear big(1000, 1000);
      ::close(ready[0]);
      for (int64_t e = 1;; ++e) {
        mgr.save(ddp::capture_snapshot(*big, nullptr, round * 1000 + e, e));
        if (e == 1) (void)!::write(ready[1], "x", 1);
      }
    }
    ::close(ready[1]);
    char c;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);  // at least one save completed
    ::close(ready[0]);
    ::usleep(std::uniform_int_distribution<int>(0, 30000)(rng));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);

    ddp::SnapshotManager mgr(ddp::SnapshotOptions(path).keep(2));
    std::vector<std::string> skipped;
    auto r = mgr.load_newest_valid(&skipped);
    ASSERT_TRUE(r.has_value()) << "round " << round;
    EXPECT_TRUE(skipped.empty()) << skipped[0];
    EXPECT_GE(r->snapshot.epochs_run, round * 1000 + 1);
    for (const auto& [epoch, file] : mgr.epoch_files()) {
      EXPECT_EQ(ddp::verify_zip_checksum(ddp::read_whole_file(file)), ddp::ChecksumStatus::kValid)
          << file;
    }
  }
}

TEST_F(SnapshotTest, PythonTorchLoadReadsCppSnapshot) {
  if (auto why = ddp::test::python_torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  torch::nn::Linear lin(20, 1);
  {
    torch::NoGradGuard g;
    lin->weight.copy_(torch::arange(20, torch::kFloat).reshape({1, 20}));
    lin->bias.fill_(0.25);
  }
  torch::optim::SGD sgd(lin->parameters(), torch::optim::SGDOptions(1e-3));
  ddp::SnapshotManager mgr(ddp::SnapshotOptions(dir_ + "/snapshot.pt"));
  mgr.save(ddp::capture_snapshot(*lin, &sgd, 4, 4));
  auto py = ddp::test::run_python(R"(
import sys, torch, zipfile
s = torch.load(sys.argv[1])
m = torch.nn.Linear(20, 1)
m.load_state_dict(s["MODEL_STATE"])
print(s["EPOCHS_RUN"], s["SAMPLER_EPOCH"], sorted(s.keys()))
print(m.weight.sum().item(), m.bias.item(), s["RNG_STATE"].dtype, s["OPTIMIZER_STATE"].dtype)
print(zipfile.ZipFile(sys.argv[1]).comment.decode()[:20])
)",
                                  dir_ + "/snapshot.pt");
  ASSERT_EQ(py.status, 0) << py.out;
  EXPECT_EQ(py.out,
            "4 4 ['EPOCHS_RUN', 'FORMAT', 'MODEL_STATE', 'OPTIMIZER_STATE', 'RNG_STATE', "
            "'SAMPLER_EPOCH']\n190.0 0.25 torch.uint8 torch.uint8\nddp-snapshot sha256=\n");
}

TEST_F(SnapshotTest, CppReadsPythonTorchSave) {
  if (auto why = ddp::test::python_torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  auto py = ddp::test::run_python(R"(
import sys, torch
d = sys.argv[1]
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(20, 3), torch.nn.BatchNorm1d(3))
with torch.no_grad():
    m[0].weight.copy_(torch.arange(60.).reshape(3, 20))
# The tutorial's snapshot: an OrderedDict state_dict (with _metadata) inside a dict.
torch.save({"MODEL_STATE": m.state_dict(), "EPOCHS_RUN": 6}, d + "/py.pt")
opt = torch.optim.Adam(m.parameters())
m(torch.randn(4, 20)).sum().backward(); opt.step()
odd = {"one": 1, "neg": -5, "big": 2**40, "f": 0.5, "t": (1, "a"), "l": [True, None],
       "p": torch.nn.Parameter(torch.ones(2)), "opt": opt.state_dict(),
       "view": torch.arange(10.)[2:8:2], "shared": [torch.arange(4)] * 2,
       "dtypes": [torch.zeros(2, dtype=t) for t in
                  (torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int8,
                   torch.uint8, torch.bool, torch.int16)],
       "bytes": b"\x00\xff", "empty": torch.zeros(0, 3)}
torch.save(odd, d + "/odd.pt")
)",
                                  dir_);
  ASSERT_EQ(py.status, 0);

  auto snap = ddp::decode_snapshot(ddp::read_whole_file(dir_ + "/py.pt"), "py.pt");
  EXPECT_EQ(snap.epochs_run, 6);
  torch::nn::Sequential m(torch::nn::Linear(20, 3), torch::nn::BatchNorm1d(3));
  ddp::restore_snapshot(snap, *m, nullptr);
  EXPECT_TRUE(torch::equal(m->named_parameters()["0.weight"],
                           torch::arange(60, torch::kFloat).reshape({3, 20})));

  // Through the resume path too: a separate main file written by Python is a candidate.
  ddp::SnapshotManager mgr(ddp::SnapshotOptions(dir_ + "/py.pt"));
  auto r = mgr.load_newest_valid();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->snapshot.epochs_run, 6);
  EXPECT_NE(r->verification.find("no ddp checksum"), std::string::npos);

  auto odd =
      ddp::torch_load_bytes(ddp::read_whole_file(dir_ + "/odd.pt"), "odd.pt").toGenericDict();
  EXPECT_EQ(odd.at("one").toInt(), 1);
  EXPECT_EQ(odd.at("neg").toInt(), -5);
  EXPECT_EQ(odd.at("big").toInt(), int64_t{1} << 40);
  EXPECT_EQ(odd.at("f").toDouble(), 0.5);
  EXPECT_EQ(odd.at("t").toTupleRef().elements()[1].toStringRef(), "a");
  EXPECT_TRUE(odd.at("l").toList().get(0).toBool());
  EXPECT_TRUE(odd.at("l").toList().get(1).isNone());
  EXPECT_TRUE(torch::equal(odd.at("p").toTensor(), torch::ones({2})));
  EXPECT_TRUE(torch::equal(odd.at("view").toTensor(), torch::tensor({2.f, 4.f, 6.f})));
  EXPECT_TRUE(torch::equal(odd.at("shared").toList().get(1).toTensor(), torch::arange(4)));
  auto dtypes = odd.at("dtypes").toList();
  std::vector<torch::ScalarType> want = {torch::kDouble, torch::kHalf, torch::kBFloat16,
                                         torch::kInt,    torch::kChar, torch::kByte,
                                         torch::kBool,   torch::kShort};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(dtypes.get(i).toTensor().scalar_type(), want[i]);
  }
  EXPECT_EQ(odd.at("bytes").toStringRef(), std::string("\x00\xff", 2));
  EXPECT_EQ(odd.at("empty").toTensor().sizes(), (std::vector<int64_t>{0, 3}));
  auto opt = odd.at("opt").toGenericDict();
  EXPECT_EQ(opt.at("state").toGenericDict().size(), 4u);  // int keys 0..3
  EXPECT_EQ(opt.at("param_groups").toList().get(0).toGenericDict().at("lr").toDouble(), 1e-3);
}

// A pickle nesting 99,999 lists ("(" x N, then "l" x N) is refused while it is parsed, with the
// byte where it went too deep, and the partial values are torn down without recursion (the
// parser once built the whole structure, refused it afterwards and then overflowed the stack
// destroying it).
TEST_F(SnapshotTest, PickleReaderRefusesDeepNestingWhileParsing) {
  const size_t n = 99999;
  std::vector<uint8_t> pkl = {0x80, 0x02};
  pkl.insert(pkl.end(), n, '(');
  pkl.insert(pkl.end(), n, 'l');
  pkl.push_back('.');
  auto no_storage = [](const std::string&) { return std::vector<uint8_t>(); };
  try {
    ddp::parse_torch_pickle(pkl.data(), pkl.size(), no_storage, "deep.pkl");
    FAIL() << "a pickle nested 99999 deep was accepted";
  } catch (const ddp::UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("nest deeper than 1000 levels"), std::string::npos) << what;
    // Refused at the "l" that wraps the innermost (empty) list in its 1001st level, not after
    // reading the whole stream: the error names the byte after that opcode.
    EXPECT_NE(what.find("at byte " + std::to_string(2 + n + 1002)), std::string::npos) << what;
  }
}

// A list appended to itself through the memo ("]" BINPUT 0, BINGET 0, APPEND) is refused by the
// conversion, naming the cycle; the parser breaks the cycle when it tears the values down (the
// ASan stage's leak check fails if it does not).
TEST_F(SnapshotTest, PickleReaderRefusesASelfContainingListWithoutLeaking) {
  const std::vector<uint8_t> pkl = {0x80, 0x02, ']', 'q', 0x00, 'h', 0x00, 'a', '.'};
  auto no_storage = [](const std::string&) { return std::vector<uint8_t>(); };
  try {
    ddp::parse_torch_pickle(pkl.data(), pkl.size(), no_storage, "cycle.pkl");
    FAIL() << "a list containing itself was accepted";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("list contains itself"), std::string::npos) << e.what();
  }
}

// Values the memo shares are converted once and shared, as Python's unpickler shares them: 40
// levels of lists each holding the previous one twice ("(" BINGET BINGET "l" BINPUT) are 2^40
// references in 366 bytes, and a 3,000-byte string referenced 50,000 times would be 150 MB of
// copies. Before, each reference was converted again: the first hit the 10^7-value limit, and
// fuzzing found 181 bytes of memo-shared dicts that took 4 GB.
TEST_F(SnapshotTest, PickleReaderSharesWhatTheMemoShares) {
  auto no_storage = [](const std::string&) { return std::vector<uint8_t>(); };
  std::vector<uint8_t> pkl = {0x80, 0x02, ']', 'q', 0x00};
  for (uint8_t level = 1; level <= 40; ++level) {
    const uint8_t below = level - 1;
    pkl.insert(pkl.end(), {'0', '(', 'h', below, 'h', below, 'l', 'q', level});  // POP, then
  }
  pkl.push_back('.');
  c10::IValue top = ddp::parse_torch_pickle(pkl.data(), pkl.size(), no_storage, "doubling.pkl");
  c10::List<c10::IValue> list = top.toList();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_TRUE(list.get(0).is(list.get(1))) << "the two references are not one list";

  // "X" BINUNICODE (3,000 bytes) BINPUT 0, then a list of 50,000 BINGET 0 (APPENDS).
  std::vector<uint8_t> str = {0x80, 0x02, ']', '(', 'X', 0xb8, 0x0b, 0x00, 0x00};
  str.insert(str.end(), 3000, 'a');
  str.insert(str.end(), {'q', 0x00});
  for (int i = 1; i < 50000; ++i) str.insert(str.end(), {'h', 0x00});
  str.insert(str.end(), {'e', '.'});
  c10::IValue strings = ddp::parse_torch_pickle(str.data(), str.size(), no_storage, "str.pkl");
  c10::List<c10::IValue> items = strings.toList();
  ASSERT_EQ(items.size(), 50000u);
  EXPECT_EQ(items.get(49999).toStringRef().size(), 3000u);
  EXPECT_EQ(items.get(0).toString().get(), items.get(49999).toString().get())
      << "each reference holds its own copy of the string";
}

TEST_F(SnapshotTest, PickleReaderRejectsCodeAndSurvivesMutations) {
  if (auto why = ddp::test::python_torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  auto py = ddp::test::run_python(R"(
import sys, torch, collections
torch.save(collections.Counter("ab"), sys.argv[1] + "/evil.pt")
torch.save({"a": [torch.arange(6).reshape(2, 3), {"b": (1.5, "x")}], "c": 3}, sys.argv[1] + "/m.pt")
)",
                                  dir_);
  ASSERT_EQ(py.status, 0);
  try {
    ddp::torch_load_bytes(ddp::read_whole_file(dir_ + "/evil.pt"), "evil.pt");
    FAIL();
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("collections.Counter"), std::string::npos) << e.what();
  }
  // Mutated pickles (record data.pkl rewritten) must parse or throw UsageError, never crash.
  auto zip = ddp::read_whole_file(dir_ + "/m.pt");
  c10::IValue whole = ddp::torch_load_bytes(zip, "m.pt");
  ASSERT_TRUE(whole.isGenericDict());
  // The pure entry point gets data.pkl's bytes, read here with LibTorch's zip reader.
  std::vector<uint8_t> pkl;
  {
    caffe2::serialize::PyTorchStreamReader reader(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(zip.data(), zip.size()));
    auto [data, size] = reader.getRecord("data.pkl");
    const auto* p = static_cast<const uint8_t*>(data.get());
    pkl.assign(p, p + size);
  }
  auto storages = [](const std::string&) { return std::vector<uint8_t>(48, 1); };
  EXPECT_NO_THROW(ddp::parse_torch_pickle(pkl.data(), pkl.size(), storages, "pkl"));
  std::mt19937 rng(7);
  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    auto m = pkl;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) m[rng() % m.size()] = static_cast<uint8_t>(rng());
    if (rng() % 4 == 0) m.resize(rng() % m.size());
    try {
      ddp::parse_torch_pickle(m.data(), m.size(), storages, "mut");
    } catch (const ddp::UsageError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
}

}  // namespace

namespace {

TEST(SnapshotRestore, ForeignOptimizerStateIsAUsageError) {
  torch::nn::Linear lin(3, 1);
  torch::optim::Adam adam(lin->parameters(), torch::optim::AdamOptions(1e-3));
  adam.zero_grad();
  lin->forward(torch::ones({2, 3})).sum().backward();
  adam.step();
  auto snap = ddp::capture_snapshot(*lin, &adam, 1, 1);
  torch::optim::SGD sgd(lin->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  try {
    ddp::restore_snapshot(snap, *lin, &sgd);
    FAIL() << "an Adam state must not load into SGD silently";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("OPTIMIZER_STATE does not fit"), std::string::npos)
        << e.what();
  }
  snap.optimizer_state = torch::Tensor();
  snap.rng_state = torch::zeros({3}, torch::kUInt8);
  EXPECT_THROW(ddp::restore_snapshot(snap, *lin, nullptr), ddp::UsageError);
}

}  // namespace
