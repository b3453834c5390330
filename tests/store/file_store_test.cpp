// FileStore specifics: several processes' worth of handles on one file, torn records left by
// a writer that died, foreign files.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "ddp/store/file_store.hpp"
#include "ddp/util/error.hpp"
#include "store_test_util.hpp"

namespace ddp::test {
namespace {

TEST(FileStoreTest, ChildProcessesCountUpTogether) {
  TempDir dir;
  std::string path = dir.file("store");
  FileStore parent(path, 10s);
  constexpr int kChildren = 4;
  constexpr int kAdds = 25;
  std::vector<pid_t> pids;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        FileStore child(path, 10s);
        for (int i = 0; i < kAdds; ++i) child.add("count", 1);
        child.set("done/" + std::to_string(c), "1");
      } catch (...) {
        code = 1;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<std::string> done;
  for (int c = 0; c < kChildren; ++c) done.push_back("done/" + std::to_string(c));
  parent.wait(done, 30s);
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(parent.get("count"), std::to_string(kChildren * kAdds));
}

TEST(FileStoreTest, TornTrailingRecordIsIgnoredThenRemoved) {
  TempDir dir;
  std::string path = dir.file("store");
  {
    FileStore store(path, 10s);
    store.set("a", "1");
  }
  {
    // A writer died after writing half a record.
    std::ofstream out(path, std::ios::app | std::ios::binary);
    out.write("S\x05\0\0\0", 5);
  }
  FileStore reader(path, 10s);
  EXPECT_EQ(reader.get("a"), "1");
  EXPECT_EQ(reader.num_keys(), 1);
  reader.set("b", "2");  // the next writer cuts the torn tail before appending
  FileStore again(path, 10s);
  EXPECT_EQ(again.multi_get({"a", "b"}), (std::vector<std::string>{"1", "2"}));
}

// The store is already open (its replay offset is before the torn bytes) when another writer
// dies mid-record; its next set() and multi_set() must land after the last complete record,
// not after the torn bytes where the next replay would cut them off.
TEST(FileStoreTest, OpenStoreWritesAfterATornRecordAreKept) {
  TempDir dir;
  std::string path = dir.file("store");
  FileStore store(path, 10s);
  store.set("a", "1");
  {
    std::ofstream out(path, std::ios::app | std::ios::binary);
    out.write("S\x05\0\0\0", 5);
  }
  store.set("b", "2");
  EXPECT_TRUE(store.check({"b"}));
  EXPECT_EQ(store.get("b"), "2");
  {
    std::ofstream out(path, std::ios::app | std::ios::binary);
    out.write("S\x03\0\0\0\x04\0\0\0ke", 11);
  }
  store.multi_set({"c", "d"}, {"3", "4"});
  EXPECT_TRUE(store.check({"a", "b", "c", "d"}));
  EXPECT_EQ(store.multi_get({"a", "b", "c", "d"}), (std::vector<std::string>{"1", "2", "3", "4"}));
  FileStore fresh(path, 10s);
  EXPECT_TRUE(fresh.check({"a", "b", "c", "d"}));
  EXPECT_EQ(fresh.num_keys(), 4);
  EXPECT_EQ(fresh.multi_get({"a", "b", "c", "d"}), (std::vector<std::string>{"1", "2", "3", "4"}));
}

TEST(FileStoreTest, ForeignFileIsRefusedNamingThePath) {
  TempDir dir;
  std::string path = dir.file("notes.txt");
  std::ofstream(path) << "hello, this is not a store\n";
  try {
    FileStore store(path, 1s);
    FAIL() << "opened a foreign file";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(FileStoreTest, MissingDirectoryIsAStoreErrorWithTheFix) {
  try {
    FileStore store("/nonexistent-ddp-dir/store", 1s);
    FAIL() << "opened a file in a missing directory";
  } catch (const StoreError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent-ddp-dir/store"), std::string::npos) << what;
    EXPECT_NE(what.find("directory must exist"), std::string::npos) << what;
  }
}

TEST(FileStoreTest, StuckLockHolderIsATimeoutNotAHang) {
  TempDir dir;
  std::string path = dir.file("store");
  FileStore store(path, 10s);
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  store.set_timeout(50ms);
  try {
    store.set("k", "v");
    FAIL() << "wrote past an exclusive lock";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("could not lock"), std::string::npos) << e.what();
  }
  ::close(fd);
  store.set_timeout(10s);
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
}

}  // namespace
}  // namespace ddp::test
