#pragma once
// ddprun's flag values: where each came from (the command line first, then its PET_ variable,
// as torchrun does) and the checks that turn a bad one into a UsageError naming that source
// ("--max-restarts: 'x' is not a restart count (0 or more)"). Private to src/launcher.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/cli.hpp"
#include "ddp/rendezvous/options.hpp"

namespace CLI {
class Option;
}

namespace ddp::launcher::detail {

// One option that takes a value: its flag names (first long spelling is used in messages),
// its PET_* variable, and the value given on the command line.
struct ValueFlag {
  std::string names;  // CLI11 spec, e.g. "--nproc-per-node,--nproc_per_node"
  std::string env;    // PET_NPROC_PER_NODE
  std::string help;
  std::string cli_value;
  CLI::Option* option = nullptr;
};

struct BoolFlag {
  std::string names;
  std::string env;
  std::string help;
  bool cli_value = false;
  CLI::Option* option = nullptr;
};

// A value with where it came from, for messages: "--max-restarts" or "PET_MAX_RESTARTS".
struct Sourced {
  std::string value;
  std::string source;
};

// The first "--" spelling among CLI11's comma-separated `names` (all of `names` without one).
std::string first_long_name(const std::string& names);

// The flag's value from the command line, else from its PET_ variable (an empty one counts as
// unset: torchrun would take "" and fail later); nullopt when neither is given, or when the
// flag has no variable (env "": torchrun reads none for --numa-binding and --logs-specs).
std::optional<Sourced> value_of(const ValueFlag& f, const EnvLookup& env);

// The flag from the command line, else its PET_ variable read as torchrun does (an integer,
// nonzero is on), except that set but empty is on (PyTorchJob's PET_STANDALONE=""); UsageError
// when that variable is not an integer.
bool bool_of(const BoolFlag& f, const EnvLookup& env);

// An integer in [min, max]; UsageError "SOURCE: 'VALUE' is not WHAT" otherwise.
int parse_int(const Sourced& s, int min, int max, const std::string& what);

// Seconds above 0 (fractions allowed).
double parse_positive_double(const Sourced& s);

// Local ranks "0" or "0,1".
std::vector<int> parse_rank_list(const Sourced& s);

// torchrun's comma-separated filter list: "a,b" -> {a, b}; ",," is a literal comma; "" -> {""}
// (one filter that every line contains, as in torchrun).
std::vector<std::string> split_filters(const std::string& text);

enum class Seconds { kZeroOrMore, kPositive };

// A ddprun knob in seconds from the environment (fractions allowed); nullopt when unset or
// empty. UsageError naming the variable when the value is not a number in range.
std::optional<std::chrono::milliseconds> env_seconds(const EnvLookup& env, const char* name,
                                                     Seconds range);

// --nnodes N or MIN:MAX, its errors naming the source actually used (PET_NNODES or --nnodes).
rdzv::NodeRange parse_nnodes(const Sourced& s);

}  // namespace ddp::launcher::detail
