// The speculative-decoding flags shared by `serval run`, `serval serve` and
// `serval bench throughput` (docs/SPECULATIVE.md):
//   --spec none|ngram|draft   --draft-model FILE (implies draft)
//   --draft-max K  --draft-min K  --ngram-min N  --ngram-max N
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "cli_util.h"
#include "load_model.h"
#include "serval/engine.h"

namespace serval::cli {

struct SpecFlags {
  std::string mode = "none";
  std::string draft_model;
  int32_t draft_max = 5, draft_min = 0, ngram_min = 1, ngram_max = 4;

  void add_to(CLI::App& app) {
    app.add_option("--spec", mode, "speculative decoding: none, ngram (prompt lookup) or draft (--draft-model)")
        ->check(CLI::IsMember({"none", "ngram", "draft"}));
    app.add_option("--draft-model", draft_model, "GGUF draft model sharing the target's vocabulary (implies --spec draft)");
    app.add_option("--draft-max", draft_max, "most drafted tokens per sequence and step")->check(CLI::Range(1, 64));
    app.add_option("--draft-min", draft_min, "fewest drafted tokens worth verifying; floor of the adaptive length")
        ->check(CLI::Range(0, 64));
    app.add_option("--ngram-min", ngram_min, "shortest n-gram matched by --spec ngram")->check(CLI::Range(1, 64));
    app.add_option("--ngram-max", ngram_max, "longest n-gram matched by --spec ngram")->check(CLI::Range(1, 64));
  }

  // Fills `out` (loading the draft model); on error prints one line and
  // returns the exit status. The engine checks the vocabulary and the ranges.
  std::optional<int> resolve(const std::string& cmd, SpecConfig* out) const {
    SpecConfig s;
    s.draft_max = draft_max;
    s.draft_min = draft_min;
    s.ngram_min = ngram_min;
    s.ngram_max = ngram_max;
    if (!draft_model.empty() && mode != "none" && mode != "draft")
      return fail(cmd, "--draft-model goes with --spec draft, not --spec " + mode);
    if (mode == "draft" && draft_model.empty()) return fail(cmd, "--spec draft needs --draft-model FILE");
    if (!draft_model.empty()) {
      auto loaded = load_model(cmd + ": draft model", draft_model);
      if (!loaded) return 2;
      s.mode = SpecConfig::Mode::draft_model;
      s.draft_model = loaded->model;
    } else if (mode == "ngram") {
      s.mode = SpecConfig::Mode::ngram;
    }
    *out = std::move(s);
    return std::nullopt;
  }
};

}  // namespace serval::cli
