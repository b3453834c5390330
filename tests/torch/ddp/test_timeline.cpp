// Timeline: Chrome trace JSON with one complete event per span.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ddp/torch/ddp/timeline.hpp"
#include "ddp/util/error.hpp"

namespace {

TEST(Timeline, WritesChromeTraceWithSpans) {
  ddp::Timeline timeline(3);
  auto t0 = ddp::Timeline::Clock::now();
  timeline.add_span("allreduce bucket 0", ddp::Timeline::Track::kComm, t0,
                    t0 + std::chrono::microseconds(250));
  { ddp::Timeline::Scope scope(&timeline, "forward", ddp::Timeline::Track::kCompute); }
  { ddp::Timeline::Scope disabled(nullptr, "ignored", ddp::Timeline::Track::kCompute); }
  EXPECT_EQ(timeline.size(), 2u);

  auto path = std::filesystem::temp_directory_path() /
              ("ddp_timeline_test_" + std::to_string(::getpid()) + ".json");
  timeline.write(path.string());
  std::ifstream in(path);
  auto doc = nlohmann::json::parse(in);
  std::filesystem::remove(path);

  int spans = 0;
  for (const auto& e : doc.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 3);
    if (e.at("ph") != "X") continue;
    ++spans;
    if (e.at("name") == "allreduce bucket 0") {
      EXPECT_EQ(e.at("dur"), 250);
      EXPECT_EQ(e.at("cat"), "comm");
      EXPECT_EQ(e.at("tid"), 1);
    } else {
      EXPECT_EQ(e.at("name"), "forward");
      EXPECT_EQ(e.at("tid"), 0);
    }
  }
  EXPECT_EQ(spans, 2);
}

TEST(Timeline, UnwritablePathIsAUsageError) {
  ddp::Timeline timeline(0);
  EXPECT_THROW(timeline.write("/nonexistent-dir/for/sure/t.json"), ddp::UsageError);
}

}  // namespace
