// ddp::remove_tree: ddp's replacement for std::filesystem::remove_all (whose copy in PyTorch's
// CUDA wheels jumps to address 0; include/ddp/util/remove_tree.hpp).
#include "ddp/util/remove_tree.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& tag) {
  std::string dir =
      (fs::temp_directory_path() / ("ddp_remove_tree_" + tag + "_" + std::to_string(::getpid())))
          .string();
  std::error_code ec;
  ddp::remove_tree(dir, ec);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& p) {
  std::ofstream(p) << "x";
}

}  // namespace

TEST(RemoveTree, RemovesANestedTreeDepthFirstAndCountsItsEntries) {
  const std::string dir = fresh_dir("nested");
  fs::create_directories(fs::path(dir) / "a" / "b" / "c");
  fs::create_directories(fs::path(dir) / "empty");
  write_file(fs::path(dir) / "top.txt");
  write_file(fs::path(dir) / "a" / "one.txt");
  write_file(fs::path(dir) / "a" / "b" / "c" / "deep.txt");
  std::error_code ec;
  // dir, a, b, c, empty, 3 files.
  EXPECT_EQ(ddp::remove_tree(dir, ec), 8u);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(dir));
}

TEST(RemoveTree, RemovesLinksWithoutFollowingThem) {
  const std::string dir = fresh_dir("links");
  const std::string outside = fresh_dir("links_target");
  write_file(fs::path(outside) / "keep.txt");
  fs::create_directory_symlink(outside, fs::path(dir) / "to_dir");
  fs::create_symlink(fs::path(outside) / "keep.txt", fs::path(dir) / "to_file");
  std::error_code ec;
  EXPECT_EQ(ddp::remove_tree(dir, ec), 3u);  // the two links and dir
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::exists(fs::path(outside) / "keep.txt")) << "a link was followed";
  ddp::remove_tree(outside, ec);
}

TEST(RemoveTree, AMissingPathIsNoErrorAndAFileIsRemoved) {
  const std::string dir = fresh_dir("file");
  std::error_code ec;
  EXPECT_EQ(ddp::remove_tree(dir + "/does-not-exist", ec), 0u);
  EXPECT_FALSE(ec) << ec.message();
  write_file(fs::path(dir) / "f");
  EXPECT_EQ(ddp::remove_tree(dir + "/f", ec), 1u);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(fs::path(dir) / "f"));
  ddp::remove_tree(dir, ec);
}

TEST(RemoveTree, AnEntryThatCannotBeRemovedSetsTheErrorAndNothingIsThrown) {
  // Files of /proc cannot be unlinked, by root either.
  std::error_code ec;
  EXPECT_EQ(ddp::remove_tree("/proc/self/status", ec), 0u);
  EXPECT_TRUE(ec) << "removing /proc/self/status reported success";
  EXPECT_TRUE(fs::exists("/proc/self/status"));
}
