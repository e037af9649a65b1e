// The --kv-type flag of serve/run/bench/bench model, and the start-up log line
// that reports what one token of KV cache costs.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <vector>
#include <string>

#include "model/model.h"
#include "serval/engine.h"
#include "tensor/kv_type.h"

namespace serval::cli {

inline void add_kv_type_option(CLI::App& app, KvType* t) {
  std::vector<std::string> names;
  for (KvType k : kAllKvTypes) names.push_back(kv_type_name(k));
  names.push_back("fp8_e4m3");
  app.add_option_function<std::string>(
         "--kv-type", [t](const std::string& s) { *t = *parse_kv_type(s); },
         "KV cache element type: f32, f16, bf16, q8_0, q4_0 or fp8 (E4M3); q8_0 and q4_0 need the model's "
         "head_dim to be a multiple of 32")
      ->check(CLI::IsMember(names))
      ->default_str(kv_type_name(*t));
}

inline void log_kv_cache(const std::string& cmd, const Engine& e) {
  const EngineStats s = e.stats();
  std::fprintf(stderr, "%s: KV cache %s, %zu bytes/token, %d blocks of %d tokens\n", cmd.c_str(),
               kv_type_name(e.config().kv_type), e.info().kv_bytes_per_token, s.kv_blocks_total,
               e.config().block_size);
  if (s.kv_swa_blocks_total > 0)
    std::fprintf(stderr,
                 "%s: sliding-window layers keep only their window of %d tokens: %d blocks of their own "
                 "(%zu bytes each; the full-attention layers' blocks take %zu); swapping off\n",
                 cmd.c_str(), e.model().config().sliding_window, s.kv_swa_blocks_total, s.kv_swa_bytes_per_block,
                 s.kv_bytes_per_block);
  const KvTierStats& t = s.kv_tiers;
  if (t.block_bytes > 0)
    std::fprintf(stderr,
                 "%s: prefix-cache tiers: RAM %lld blocks (%.1f MiB), disk %s (%.1f MiB budget, %lld block files "
                 "recovered, %lld of another model or layout ignored, %lld damaged deleted)\n",
                 cmd.c_str(), (long long)t.ram_capacity_blocks,
                 (double)t.ram_capacity_blocks * (double)t.block_bytes / 1048576.0,
                 e.config().kv_cache_dir.empty() ? "off" : e.config().kv_cache_dir.c_str(),
                 (double)t.disk_budget_bytes / 1048576.0, (long long)t.disk_recovered, (long long)t.disk_foreign,
                 (long long)t.disk_corrupt);
}

}  // namespace serval::cli
