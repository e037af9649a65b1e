// Profile: what `serval plan profile` measured of one model on one machine,
// and the step-time model the capacity planner builds from it.
//
// An engine step computes a mixed batch: decode tokens of many sequences and
// prefill chunks (DESIGN.md, scheduler). Its time is modelled as
//
//   step_seconds(n_tokens, decode_pairs, prefill_pairs, n_seqs)
//     = T(n_tokens)                     matmuls: piecewise linear between the
//                                       measured token counts (one sequence,
//                                       attention subtracted), the last slope
//                                       extended beyond the largest
//     + attn_decode_s_per_pair * decode_pairs
//                                       attention of one-token chunks: each
//                                       query reads its whole context
//     + attn_prefill_s_per_pair * prefill_pairs
//                                       attention of longer chunks: query tiles
//                                       share each K/V read, so a pair costs less
//     + S(n_seqs)                       per-sequence work in the forward beyond
//                                       one sequence's (logits rows, attention
//                                       tiles): piecewise linear in n_seqs,
//                                       S(1) = 0; not linear, as the logits
//                                       matmul changes kernels with its rows
//     + engine_step_s + engine_seq_s * n_seqs
//                                       the engine's own work around the
//                                       forward (scheduling, sampling, output)
//
// where a pair is one query token against one context token (itself
// included). The coefficients are fitted from the measured points by
// fit_step_model(); a profile file carries both, so a reader can check the fit.
//
// Plain values; no threads.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace serval::plan {

// One sequence's chunk of `n_tokens` at positions [start, start + n_tokens), timed.
struct ChunkPoint {
  int32_t n_tokens = 0;
  double seconds = 0;
  int64_t start = 0;
};

// One step of `batch` sequences, each decoding one token at context `depth`.
struct DecodePoint {
  int32_t batch = 0;
  int64_t depth = 0;
  double seconds = 0;
};

// An engine-level decode measurement: `batch` concurrent requests, the
// median inter-token latency, against the forward alone at the same shape.
struct EnginePoint {
  int32_t batch = 0;
  int64_t depth = 0;       // mean context during the measured tokens
  double itl_s = 0;        // median time between tokens of one stream
};

struct Profile {
  static constexpr int kVersion = 1;

  // Machine and build.
  std::string cpu;         // model name from /proc/cpuinfo
  int32_t cores = 0;       // hardware threads the OS reports
  int32_t threads = 0;     // compute threads used for the measurements
  std::string isa;         // kernel level
  std::string build;       // version and compiler
  std::string created;     // UTC time, ISO 8601

  // Model.
  std::string model_path, model_arch, model_type;
  uint64_t model_bytes = 0;        // all tensors
  uint64_t weight_bytes_per_token = 0;  // what one decode step reads of the weights
  int64_t n_ctx = 0;               // longest context the profile's model takes

  // KV cache.
  std::string kv_type;
  uint64_t kv_bytes_per_token = 0;  // all layers, K and V
  int32_t block_size = 16;

  // Roofline (0 where not measured).
  double mem_read_gb_s = 0;
  double fp32_gflops = 0;
  double int8_gops = 0;

  // Measurements.
  std::vector<ChunkPoint> prefill;
  std::vector<DecodePoint> decode;
  std::vector<EnginePoint> engine;

  // The fitted step-time model (see the top of this file).
  std::vector<ChunkPoint> matmul;  // T(n), increasing n, seconds non-decreasing (start unused)
  double attn_decode_s_per_pair = 0;
  double attn_prefill_s_per_pair = 0;
  std::vector<ChunkPoint> per_seq;  // S(n): n_tokens = sequences, seconds; starts at {1, 0}
  double engine_step_s = 0;
  double engine_seq_s = 0;
};

// Seconds of one engine step of n_tokens tokens from n_seqs sequences whose
// one-token chunks touch decode_pairs (query, context token) pairs and whose
// longer chunks touch prefill_pairs. The profile must be fitted.
double step_seconds(const Profile& p, int64_t n_tokens, double decode_pairs, double prefill_pairs, int64_t n_seqs);

// The step of a decode batch: b sequences, one token each at context depth d.
double decode_step_seconds(const Profile& p, int64_t b, int64_t depth);
// One chunk of n tokens of a single sequence starting at position start.
double chunk_step_seconds(const Profile& p, int64_t n, int64_t start);

// Attention pairs of a chunk of n tokens starting at position start:
// sum over its tokens of the context each one attends to (itself included).
inline double attn_pairs_of(int64_t start, int64_t n) {
  return (double)n * (double)start + (double)n * (double)(n + 1) / 2.0;
}

// Fits matmul, the attention, per-sequence and engine terms from the
// measured points. Needs prefill points at two or more sizes from position 0;
// prefill points of one size at two starts for the prefill attention term,
// decode points of one batch at two depths for the decode attention term,
// engine points for the engine terms (each 0 otherwise). invalid_argument
// when the points cannot be fitted.
Status fit_step_model(Profile* p);

// The profile of the same machine running `factor` times slower (every
// measured and fitted time multiplied by it): a profile re-calibrated to the
// machine's speed at another moment (`serval plan --validate` measures the
// factor just before the run). factor > 0.
Profile scaled(const Profile& p, double factor);

nlohmann::json to_json(const Profile& p);
// Validates every field (ranges, sorted points, a fitted model); the error
// names the field.
Expected<Profile> profile_from_json(const nlohmann::json& j);
// Reads and validates a profile file (bounded to 16 MiB).
Expected<Profile> read_profile(const std::string& path);

}  // namespace serval::plan
