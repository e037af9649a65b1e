// The sampling flags `serval run` and `serval chat` share (llama-cli's names
// and defaults), and the SamplingParams they give.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>

#include "serval/sampling_params.h"

namespace serval::cli {

struct SamplingFlags {
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, typical_p = 1.0f, repeat_penalty = 1.0f;
  float freq_penalty = 0.0f, presence_penalty = 0.0f;
  int top_k = 40, repeat_last_n = 64;
  std::optional<uint64_t> seed;

  void add_to(CLI::App& app) {
    app.add_option("--temp", temp, "temperature (0: greedy)")->check(CLI::Range(0.0f, 100.0f));
    app.add_option("--top-k", top_k, "top-k (0: off)")->check(CLI::Range(0, 1 << 24));
    app.add_option("--top-p", top_p, "top-p (1: off)");
    app.add_option("--min-p", min_p, "min-p (0: off)");
    app.add_option("--typical", typical_p, "locally typical sampling (1: off)");
    app.add_option("--repeat-penalty", repeat_penalty, "repetition penalty (1: off)");
    app.add_option("--repeat-last-n", repeat_last_n, "penalty window (-1: whole history, 0: off)");
    app.add_option("--frequency-penalty", freq_penalty, "frequency penalty");
    app.add_option("--presence-penalty", presence_penalty, "presence penalty");
    app.add_option("--seed", seed, "random seed (default: random)");
  }

  // Sets these fields of *p (the caller validates).
  void apply(SamplingParams* p) const {
    p->temperature = temp;
    p->top_k = top_k;
    p->top_p = top_p;
    p->min_p = min_p;
    p->typical_p = typical_p;
    p->repetition_penalty = repeat_penalty;
    p->frequency_penalty = freq_penalty;
    p->presence_penalty = presence_penalty;
    p->penalty_last_n = repeat_last_n;
    p->seed = seed;
  }
};

}  // namespace serval::cli
