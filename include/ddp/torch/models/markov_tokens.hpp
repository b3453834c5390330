#pragma once
// MarkovTokens: the GPT model's training text, generated locally and deterministically (nothing
// is downloaded). A fixed random Markov chain over `vocab` tokens: every token has `branching`
// successors drawn once from the seed, and each next token is one of its current token's
// successors, chosen uniformly. A model that learns the successor table reaches a cross-entropy
// of about log(branching) nats (entropy_floor()), from log(vocab) at initialization, so the loss
// visibly falls within a few dozen steps on small vocabularies.
//
// The same numbers come out of bench/ddp/bench_gpt.py's twin (a SplitMix64 stream, integer
// arithmetic only), so ddp and PyTorch train on identical batches:
//   table:  rng = SplitMix64(mix(seed, 0)); successor[t][j] = rng() % vocab, t-major
//   row r of step s on rank k:  rng = SplitMix64(mix(mix(mix(mix(seed, 1), k), s), r));
//           token_0 = rng() % vocab; token_i = successor[token_{i-1}][rng() % branching]
// where mix(h, v) = finalize(h ^ (v + golden)) and SplitMix64's rng() = finalize(state +=
// golden), all modulo 2^64.

#include <torch/arg.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/util/error.hpp"

namespace ddp::models {

struct MarkovTokensOptions {
  static constexpr int64_t kVocab = 8192;
  static constexpr int64_t kBranching = 4;

  TORCH_ARG(int64_t, vocab) = kVocab;
  // Successors per token: the entropy of the next token given the current one is log(branching).
  TORCH_ARG(int64_t, branching) = kBranching;
  TORCH_ARG(uint64_t, seed) = 0;
};

class MarkovTokens {
 public:
  static constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

  // Throws UsageError on a vocabulary or branching below 1.
  explicit MarkovTokens(MarkovTokensOptions options = {}) : options_(options) {
    if (options.vocab() < 1 || options.branching() < 1) {
      throw UsageError("MarkovTokens: vocab (" + std::to_string(options.vocab()) +
                       ") and branching (" + std::to_string(options.branching()) +
                       ") must be at least 1");
    }
    SplitMix64 rng(mix(options.seed(), 0));
    successors_.resize(static_cast<size_t>(options.vocab() * options.branching()));
    for (auto& s : successors_) s = static_cast<int64_t>(rng() % vocab());
  }

  const MarkovTokensOptions& options() const { return options_; }

  // The loss a perfect model of the chain reaches (nats): log(branching), a little above the
  // truth where a token's successors repeat.
  double entropy_floor() const { return std::log(static_cast<double>(options_.branching())); }

  // int64 [batch, seq + 1] on the CPU: rows `batch` of step `step` for rank `rank`; train on
  // inputs [:, :-1] against targets [:, 1:]. A pure function of (seed, rank, step, row), so
  // ranks draw disjoint streams and a restarted job sees the same data.
  torch::Tensor batch(int64_t rank, int64_t step, int64_t batch, int64_t seq) const {
    auto out = torch::empty({batch, seq + 1}, torch::kInt64);
    int64_t* p = out.data_ptr<int64_t>();
    const uint64_t key =
        mix(mix(mix(options_.seed(), 1), static_cast<uint64_t>(rank)), static_cast<uint64_t>(step));
    for (int64_t r = 0; r < batch; ++r) {
      SplitMix64 rng(mix(key, static_cast<uint64_t>(r)));
      int64_t token = static_cast<int64_t>(rng() % vocab());
      *p++ = token;
      for (int64_t i = 0; i < seq; ++i) {
        const uint64_t j = rng() % static_cast<uint64_t>(options_.branching());
        token = successors_[static_cast<size_t>(token * options_.branching()) + j];
        *p++ = token;
      }
    }
    return out;
  }

 private:
  static uint64_t finalize(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  static uint64_t mix(uint64_t h, uint64_t v) { return finalize(h ^ (v + kGolden)); }

  struct SplitMix64 {
    explicit SplitMix64(uint64_t seed) : state(seed) {}
    uint64_t operator()() { return finalize(state += kGolden); }
    uint64_t state;
  };

  uint64_t vocab() const { return static_cast<uint64_t>(options_.vocab()); }

  MarkovTokensOptions options_;
  std::vector<int64_t> successors_;  // [vocab][branching]
};

}  // namespace ddp::models
