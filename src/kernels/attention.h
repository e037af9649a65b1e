// Attention over the paged KV cache, reading K/V in their stored type
// (tensor/kv_type.h), for a tile of consecutive query tokens of one sequence
// and one KV head group; and the row codecs that write/read that type.
//
// Tile kernel (flash style): one pass over the K/V positions the tile needs,
// 16 positions (a "chunk", aligned to absolute positions 16c .. 16c + 15) at a
// time; each chunk's K head slices are transposed once into an L1 tile and its
// V slices read (F32/F16/BF16 in place, the block and FP8 types decoded once
// into a 16 x head_dim buffer), used by every query row of the tile (m tokens x
// group heads); the softmax is online (running max, running sum, rescaled
// accumulator).
//
// Numerics (SIMD levels, identical at avx2/avx512/avx512vnni). Per query row
// at position p, for chunks c = 0 .. p / 16 in order, n = min(16, p + 1 - 16c):
//   s[j]  = ((a0 + a1) + (a2 + a3)) * scale, j < n, where a_r is the fma chain
//           over d = r, r + 4, ... (d < head_dim) of q[d] * k_j[d] (the chunk's
//           K is transposed so the 16 scores form one vector; no hsum)
//   mnew  = max(mold, max_j s[j]); a = exp(mold - mnew) (std::exp; 0 at start)
//   e[j]  = vexp(s[j] - mnew) (j < n; 0 beyond);  l = l * a + hsum(e)
//   acc   = acc * a (skipped when a == 1), then acc = fma(e[j], v_j, acc), j < n
//   out   = acc * (1 / l)
// With a sliding window, chunks wholly before the row's lo are skipped and
// positions before lo in its first chunk are masked (e[j] = 0); the K/V rows
// before the tile's first lo are never read (their blocks may be released).
// Soft-capping applies to s[j] before the max.
// Every step depends only on the row's own query and position, never on the
// tile's size m or start p0, on the other rows or on the thread split: a row
// computed alone equals the same row within any tile, bit for bit (batch
// invariance). The ref level is a plain two-pass softmax per query (the oracle).
//
// Thread-safe (thread-local scratch only).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/kv_type.h"

namespace serval::kernels {

// Stores x[0, n) as type t at dst (kv_row_bytes(t, n) bytes). Block types
// (q8_0, q4_0) take one F16 scale per 32 elements: q8_0 d = max|x| / 127,
// q4_0 d = x_maxabs / -8 (llama.cpp's reference rounding); n % 32 == 0.
void kv_store_row(KvType t, const float* x, int64_t n, uint8_t* dst);
// Decodes n elements stored as t at src (the exact values the kernels use).
void kv_load_row(KvType t, const uint8_t* src, int64_t n, float* dst);

// One layer's K or V of one sequence: position p is row p % block_size of
// blocks[p / block_size]; a row holds all KV heads (row_bytes bytes), head g's
// slice starting at kv_row_bytes(type, g * head_dim).
struct KvView {
  const uint8_t* const* blocks = nullptr;
  int32_t block_size = 16;
  size_t row_bytes = 0;
  KvType type = KvType::f32;
};

struct AttentionTile {
  const float* q = nullptr;  // token i, query head h at q + i * q_stride + h * head_dim
  int64_t q_stride = 0;
  KvView k, v;
  int64_t p0 = 0;  // token i sits at position p0 + i and attends to [lo(p0 + i), p0 + i]
  int32_t window = 0;  // sliding window: lo(p) = max(0, p - window + 1); 0: lo(p) = 0 (full attention)
  float softcap = 0.0f;  // > 0: each score s (after scale) becomes softcap * tanh(s / softcap) (Gemma 2)
  // Attention sinks (gpt-oss): one logit per query head [n_heads] that joins
  // the softmax's denominator only (no value): out = sum_j e^(s_j - m) v_j /
  // (sum_j e^(s_j - m) + e^(sink - m)). Null: none.
  const float* sinks = nullptr;
  int32_t m = 1;   // tokens in the tile
  int32_t n_heads = 1, n_kv_heads = 1, head_dim = 0;
  int32_t kv_head = 0;  // query heads kv_head * group .. + group - 1, group = n_heads / n_kv_heads
  float scale = 1.0f;
  float* out = nullptr;  // token i, head h at out + i * out_stride + h * head_dim
  int64_t out_stride = 0;
};

// Computes the tile at the active kernel level (matmul.h's active_isa()).
void attention_tile(const AttentionTile& t);

}  // namespace serval::kernels
