// The --kv-type flag of serve/run/bench/bench model, and the start-up log line
// that reports what one token of KV cache costs.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "serval/engine.h"
#include "tensor/kv_type.h"

namespace serval::cli {

inline void add_kv_type_option(CLI::App& app, KvType* t) {
  std::map<std::string, KvType> names;
  for (KvType k : kAllKvTypes) names[kv_type_name(k)] = k;
  names["fp8_e4m3"] = KvType::fp8;
  app.add_option("--kv-type", *t,
                 "KV cache element type: f32, f16, bf16, q8_0, q4_0 or fp8 (E4M3); q8_0 and q4_0 need the "
                 "model's head_dim to be a multiple of 32")
      ->transform(CLI::CheckedTransformer(names, CLI::ignore_case))
      ->default_str(kv_type_name(*t));
}

inline void log_kv_cache(const std::string& cmd, const Engine& e) {
  const EngineStats s = e.stats();
  std::fprintf(stderr, "%s: KV cache %s, %zu bytes/token, %d blocks of %d tokens\n", cmd.c_str(),
               kv_type_name(e.config().kv_type), e.info().kv_bytes_per_token, s.kv_blocks_total,
               e.config().block_size);
}

}  // namespace serval::cli
