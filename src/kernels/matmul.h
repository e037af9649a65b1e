// Batched matrix products and attention of the forward pass: the one dispatch
// point the model calls. The kernel level (Isa: ref | avx2 | avx512 |
// avx512vnni, avx2vnni) is chosen once, at first use, from CPUID and SERVAL_ISA
// (common/cpu_features.h); ref/ holds the scalar references the SIMD kernels
// are tested against (tests/kernels/matmul_simd_test.cpp).
//
// Numerics. The ref level dequantizes each weight row to F32 and takes F32 dot
// products. The SIMD levels do what llama.cpp does: for quantized weights they
// quantize each activation row once per call to 8-bit blocks (32 elements for
// Q4_0/Q8_0/IQ4_NL, 256 for the K-quants) and take integer dot products, so
// results differ from ref by the activation rounding (about 1/254 of each
// block's largest |x|, relative); F16/BF16/F32 weights use F32 activations and
// F32 FMA. All SIMD levels give bit-identical results to each other.
//
// Batch invariance: every output element is computed by the same code in the
// same reduction order whatever the batch size or composition and whatever the
// thread count, so a sequence gets bit-identical results alone or batched with
// others (tests compare with memcmp).
//
// Thread safety: matmul/attention may run concurrently from several threads
// (each uses thread-local scratch), but one ThreadPool serves one caller at a
// time (thread_pool.h). set_isa must not race with running kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/cpu_features.h"
#include "common/thread_pool.h"
#include "tensor/dtype.h"

namespace serval::kernels {

// The least work (multiply-adds) worth one parallel_for chunk: below it a
// hand-off to another thread costs more than the work. Used as the grain of
// every kernel split (matmul rows here, attention tasks in the forward).
inline constexpr int64_t kMinChunkMacs = int64_t(1) << 18;

// Y[i, r] = dot(W[r, :], X[i, :]) for i < n, r < rows. W is [rows, cols] of type
// t (row_size(t, cols) bytes per row); X is [n, cols] F32; Y is [n, rows] F32.
// cols must be a multiple of t's block size. Each weight row (tile) is read once
// per call for the whole batch. Rows are split over the pool's threads (pool
// may be nullptr: the calling thread does everything).
// Fast paths: every type the reference supports (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL, Q2_K .. Q6_K, IQ4_XS, F16, BF16, F32).
void matmul(DType t, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
            ThreadPool* pool);

// A weight matrix repacked once (at model load) into a layout the SIMD kernels
// read faster. Today: Q4_0, IQ4_NL, Q8_0, Q4_K and Q6_K with 16 rows interleaved
// (kernel_table.h's X16 and K-quant x16 layouts), so that each integer dot instruction serves 16 weight rows and
// a block's integer sum is finished before any float step: about 2.5x fewer
// instructions per multiply-add than over the stored rows, same bytes.
//
// Numerics of matmul(PackedMatrix) at the SIMD levels: activations quantized
// as for the stored rows (Q8 per 32 with F16-rounded scales; Q8_K per 256 for
// the K-quants); per (row r, activation row i), blocks b in order: T = exact
// integer dot of block b, acc = fma(float(T), d_w * d_x, acc); Y = acc. (The
// K-quants: T sums the sub-blocks' integer dots times their integer scales;
// Q4_K then subtracts float(M) * (dmin * d_x), M its exact min term: see
// x86/packed_kq.inc.) Identical at every SIMD level, for every batch
// size and composition and every thread count (batch invariance), but not bit
// for bit equal to matmul() over the unpacked rows. The ref level dequantizes
// rows to F32 as for the stored rows.
class PackedMatrix {
 public:
  // True when a packed layout exists for t.
  static bool packable(DType t);
  // True when w (as pack() takes it) packs exactly: packable(t), and for
  // MXFP4 every block's scale 2^(e - 128) is an F16 (e in [104, 143]) or the
  // block is all zeros. Other MXFP4 matrices stay on their stored rows.
  static bool packable_data(DType t, const void* w, int64_t rows, int64_t cols);
  // The packed copy of w ([rows, cols] of t, as matmul() takes it); t must be
  // packable and cols a multiple of its block size.
  static PackedMatrix pack(DType t, const void* w, int64_t rows, int64_t cols);

  PackedMatrix() = default;
  DType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  const uint8_t* data() const { return buf_.get(); }
  size_t bytes() const { return bytes_; }
  size_t group_bytes() const;  // one group of 16 rows
  // Row r as F32 (the reference path).
  void dequantize_row(int64_t r, float* out) const;

 private:
  // mapped > 0: a mapping of its own, that many bytes (munmap); 0: from the heap (free).
  struct Free {
    Free() noexcept : mapped(0) {}
    explicit Free(size_t n) noexcept : mapped(n) {}
    size_t mapped;
    void operator()(uint8_t* p) const;
  };
  DType type_ = DType::f32;
  int64_t rows_ = 0, cols_ = 0;
  size_t bytes_ = 0;
  std::unique_ptr<uint8_t, Free> buf_;
};

// Y[i, r] = dot(W[r, :], X[i, :]) for the packed W; as matmul() above.
void matmul(const PackedMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool);

// One product of matmul_many: Y = W X for its own packed W ([n, W.rows()]).
struct PackedProduct {
  const PackedMatrix* w;
  float* y;
};

// Several products of the same X (a layer's Q, K and V; gate and up), each Y
// bit for bit what matmul(*w, x, n, y, pool) gives, with less work between
// them: X is quantized once per activation format the weights use (not once
// per product), and all products' rows run in one parallel_for (one hand-off
// to the workers and one wait, not one per product). Every W has X's cols.
void matmul_many(const PackedProduct* products, size_t count, const float* x, int64_t n, ThreadPool* pool);

// One product of matmul_grouped: Y = W X with its own packed W, its own X
// ([n, W.cols()] F32) and its own Y ([n, W.rows()]). With `rows`, row i of X
// is row rows[i] of x (the rows of the tokens that chose an expert): products
// that gather from the same x quantize each of its rows once between them.
struct GroupedProduct {
  const PackedMatrix* w;
  const float* x;
  int64_t n;
  float* y;
  const int64_t* rows = nullptr;
};

// Many products of different inputs (a mixture-of-experts layer: each
// expert's matrices times the rows of the tokens that chose it), each Y bit for
// bit what matmul(*w, x, n, y, pool) gives, with two hand-offs to the pool in
// all instead of two per product: one parallel_for quantizes every product's
// activation rows, one runs every product's weight rows (one index of 16-row
// units over all of them, so that a thread streams several experts' matrices
// back to back instead of half of each). Products with n == 0 are skipped.
void matmul_grouped(const GroupedProduct* products, size_t count, ThreadPool* pool);

// Fixed-order F32 dot product (8 interleaved partial sums, then pairwise).
float dot_f32(const float* a, const float* b, int64_t n);

// Causal attention of one query token over positions [0, n_ctx) whose K/V rows
// live in blocks: position p is row p % block_size of k_blocks[p / block_size]
// (each block [block_size, kv_stride] F32, head h's slice at h * head_dim).
// q: [n_heads, head_dim]; out: [n_heads, head_dim]; scratch: n_ctx floats.
// Grouped-query: query head h reads KV head h / (n_heads / n_kv_heads).
// The result depends only on this token's inputs (never on other tokens of a
// batch); SIMD levels agree bit for bit with each other and within float
// rounding with ref.
void attention(const float* q, const float* const* k_blocks, const float* const* v_blocks, int32_t block_size,
               int64_t kv_stride, int64_t n_ctx, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale,
               float* out, float* scratch);

// The kernel level in use (selected_isa() unless set_isa changed it), and its
// name ("ref", "avx2", "avx2vnni", "avx512", "avx512vnni") for the CLI to print.
Isa active_isa();
inline const char* active_isa_name() { return isa_name(active_isa()); }

// Switches the kernel level, capped at what this CPU supports (the highest
// supported level <= isa); returns the level now in use. For tests and
// benchmarks; must not be called while a kernel runs.
Isa set_isa(Isa isa);

// True when matmul has a SIMD fast path for t at the active level.
bool has_fast_matmul(DType t);

}  // namespace serval::kernels
