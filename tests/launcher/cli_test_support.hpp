#pragma once
// Helpers of the in-process tests of ddprun's command line (launcher_unit_test.cpp,
// torchrun_flags_test.cpp): a made-up environment, a parse that must succeed, and the usage
// error a parse gives.

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/cli.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher::test {

inline EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The options `args` give with `env` as the only environment; a test failure when they are
// not a launch.
inline LaunchOptions parse(const std::vector<std::string>& args,
                           std::map<std::string, std::string> env = {}) {
  ParsedCommandLine p = parse_command_line(args, fake_env(std::move(env)));
  EXPECT_TRUE(p.options.has_value());
  return p.options.value_or(LaunchOptions{});
}

// The UsageError message the parse throws, or "<no error>".
inline std::string usage_error(const std::vector<std::string>& args,
                               std::map<std::string, std::string> env = {}) {
  try {
    parse_command_line(args, fake_env(std::move(env)));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace ddp::launcher::test
