// The dispatch point: picks the kernel table once (CPUID + SERVAL_ISA), prepares
// quantized activations and splits the rows over the thread pool. No SIMD code
// here (this file is compiled for baseline x86-64).
#include "kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <sys/mman.h>

#include "common/status.h"
#include "kernels/act_quant.h"
#include "kernels/kernel_table.h"
#include "kernels/packed_kq.h"
#include "kernels/ref/quants.h"
#include "tensor/quant_blocks.h"

namespace serval::kernels {
namespace {

const detail::KernelTable* table_of(Isa isa) {
  switch (isa) {
    case Isa::ref: return nullptr;
    case Isa::avx2: return detail::kernel_table_avx2();
    case Isa::avx2vnni: return detail::kernel_table_avx2vnni();
    case Isa::avx512: return detail::kernel_table_avx512();
    case Isa::avx512vnni: return detail::kernel_table_avx512vnni();
  }
  return nullptr;
}

struct Active {
  explicit Active(Isa i) : table(table_of(i)), isa(i) {}
  std::atomic<const detail::KernelTable*> table;
  std::atomic<Isa> isa;
};

// The highest level <= want that this CPU and this build support.
Isa cap(Isa want) {
  const CpuFeatures& f = cpu_features();
  for (int i = (int)want; i > 0; --i) {
    const Isa isa = (Isa)i;
    if (isa_supported(isa, f) && table_of(isa) != nullptr) return isa;
  }
  return Isa::ref;
}

Active& active() {
  static Active a(cap(selected_isa()));
  return a;
}

const detail::KernelTable* table() { return active().table.load(std::memory_order_relaxed); }

// ---- reference path -----------------------------------------------------------

void matmul_ref(DType t, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
                ThreadPool* pool) {
  const size_t stride = row_size(t, cols);
  const auto* base = static_cast<const uint8_t*>(w);
  auto work = [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> row;
    if ((int64_t)row.size() < cols) row.resize((size_t)cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr;
      if (t == DType::f32) {
        wr = reinterpret_cast<const float*>(base + (size_t)r * stride);
      } else {
        ref::dequantize_row(t, base + (size_t)r * stride, row.data(), cols);
        wr = row.data();
      }
      for (int64_t i = 0; i < n; ++i) y[i * rows + r] = dot_f32(wr, x + i * cols, cols);
    }
  };
  if (pool) pool->parallel_for(rows, work, 16);
  else work(0, rows);
}

void attention_ref(const float* q, const float* const* k_blocks, const float* const* v_blocks, int32_t block_size,
                   int64_t kv_stride, int64_t n_ctx, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                   float scale, float* out, float* scratch) {
  const int32_t group = n_heads / n_kv_heads;
  for (int32_t h = 0; h < n_heads; ++h) {
    const int64_t koff = (int64_t)(h / group) * head_dim;
    const float* qh = q + (int64_t)h * head_dim;
    float mx = -INFINITY;
    for (int64_t p = 0; p < n_ctx; ++p) {
      const float* kp = k_blocks[p / block_size] + (p % block_size) * kv_stride + koff;
      scratch[p] = dot_f32(qh, kp, head_dim) * scale;
      mx = scratch[p] > mx ? scratch[p] : mx;
    }
    float sum = 0.0f;
    for (int64_t p = 0; p < n_ctx; ++p) {
      scratch[p] = std::exp(scratch[p] - mx);
      sum += scratch[p];
    }
    const float inv = 1.0f / sum;
    float* oh = out + (int64_t)h * head_dim;
    for (int32_t d = 0; d < head_dim; ++d) oh[d] = 0.0f;
    for (int64_t p = 0; p < n_ctx; ++p) {
      const float* vp = v_blocks[p / block_size] + (p % block_size) * kv_stride + koff;
      const float wgt = scratch[p] * inv;
      for (int32_t d = 0; d < head_dim; ++d) oh[d] += wgt * vp[d];
    }
  }
}

// 64-byte aligned, thread-local scratch for prepared activations.
uint8_t* act_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - (p & 63)) & 63);
}

// The work of one 16-row unit for the split into chunks: its multiply-adds,
// but at least kMacsPerWeightByte per weight byte it streams. A decode step
// reads each weight once, so its time goes with the bytes: F32 weights take
// 4 bytes per multiply-add, and kMinChunkMacs of them (1 MB, about 80 µs on
// one core) kept the 128 x 2048 F32 router of a MoE layer on one thread
// while the other waited. (One byte streamed costs about as long as 8-12
// int8 multiply-adds on this class of machine.)
constexpr int64_t kMacsPerWeightByte = 8;
int64_t unit_work(int64_t macs, size_t bytes) {
  return std::max<int64_t>({1, macs, kMacsPerWeightByte * (int64_t)bytes});
}

// Runs fn over all rows, split over the pool in units of 16 rows (a multiple of
// every tile height and the packed group size), at least kMinChunkMacs of work
// (unit_work) per chunk so that small matrices stay on one thread.
// unit_bytes: the weight bytes of 16 rows.
void run_rows(detail::MatmulRowsFn fn, const detail::MatmulTask& task, size_t unit_bytes, ThreadPool* pool) {
  constexpr int64_t kUnit = 16;
  const int64_t rows = task.rows;
  if (pool == nullptr) {
    fn(task, 0, rows);
    return;
  }
  const int64_t units = (rows + kUnit - 1) / kUnit;
  const int64_t per_unit = unit_work(kUnit * task.cols * task.n, unit_bytes);
  const int64_t grain = std::max<int64_t>(1, kMinChunkMacs / per_unit);
  pool->parallel_for(
      units, [&](int64_t u0, int64_t u1) { fn(task, u0 * kUnit, std::min(rows, u1 * kUnit)); }, grain);
}

// Bytes of one activation row as packed kernel k reads it (q8_k or q8_0p).
size_t packed_act_row_bytes(const detail::MatmulKernel& k, int64_t cols) {
  return k.act == detail::ActKind::q8_k ? detail::act_q8_k_row_bytes(cols) : detail::act_q8_0p_row_bytes(cols);
}

// Rows [i0, i1) of X quantized for packed kernel k, row i at act + i * its row bytes.
void quantize_packed_act(const detail::KernelTable* tab, const detail::MatmulKernel& k, const float* x, int64_t cols,
                         int64_t i0, int64_t i1, uint8_t* act) {
  const size_t stride = packed_act_row_bytes(k, cols);
  for (int64_t i = i0; i < i1; ++i) {
    uint8_t* dst = act + (size_t)i * stride;
    if (k.act == detail::ActKind::q8_k) tab->quantize_q8_k(x + i * cols, cols, dst);
    else tab->quantize_q8_0p(x + i * cols, cols, k.act_offset, dst);
  }
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

Isa active_isa() { return active().isa.load(std::memory_order_relaxed); }

Isa set_isa(Isa want) {
  const Isa isa = cap(want);
  Active& a = active();
  a.isa.store(isa);
  a.table.store(table_of(isa));
  return isa;
}

bool has_fast_matmul(DType t) {
  const detail::KernelTable* tab = table();
  return tab != nullptr && tab->matmul_kernel(t).fn != nullptr;
}

void matmul(DType t, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
            ThreadPool* pool) {
  if (rows <= 0 || n <= 0) return;
  const detail::KernelTable* tab = table();
  const detail::MatmulKernel k = tab ? tab->matmul_kernel(t) : detail::MatmulKernel{};
  if (k.fn == nullptr) {
    matmul_ref(t, w, rows, cols, x, n, y, pool);
    return;
  }
  const auto tr = dtype_traits(t);
  SERVAL_ASSERT(tr.has_value() && cols >= 0 && cols % tr->block_size == 0);

  detail::MatmulTask task{.w = static_cast<const uint8_t*>(w), .w_stride = row_size(t, cols), .rows = rows,
                          .cols = cols, .x = x, .n = n, .y = y};
  const bool parallel = pool != nullptr && pool->n_threads() > 1;

  // Quantize the activation rows once for the whole call (row by row: the
  // result of a row never depends on the others).
  if (k.act != detail::ActKind::f32) {
    const bool k32 = k.act == detail::ActKind::q8_32;
    task.act_stride = k32 ? detail::act_q8_32_row_bytes(cols) : detail::act_q8_k_row_bytes(cols);
    uint8_t* act = act_scratch(task.act_stride * (size_t)n);
    task.act = act;
    auto quantize = [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        if (k32) tab->quantize_q8_32(x + i * cols, cols, k.act_offset, act + (size_t)i * task.act_stride);
        else tab->quantize_q8_k(x + i * cols, cols, act + (size_t)i * task.act_stride);
      }
    };
    // (SIMD quantization runs at several GB/s: only long prompts are worth a
    // parallel_for.)
    if (parallel && n * cols >= (1 << 18)) pool->parallel_for(n, quantize);
    else quantize(0, n);
  }

  run_rows(k.fn, task, 16 * task.w_stride, parallel ? pool : nullptr);
}

namespace {
// Where a stored 32-block's fields sit (bytes from the block's start; -1:
// none), and the bytes of a block's quants for 16 rows in the X16 layouts
// (kernel_table.h).
struct X16Fields {
  int m = -1;   // F16 min (Q4_1, Q5_1)
  int qh = -1;  // 32 fifth bits (Q5_0, Q5_1)
  int qs = 2;   // nibbles (16 bytes) or Q8_0's 32 bytes
  size_t qs_bytes = 256;
};
X16Fields x16_fields(DType t) {
  switch (t) {
    case DType::q8_0: return {-1, -1, 2, 512};
    case DType::q4_1: return {2, -1, 4, 256};
    case DType::q5_0: return {-1, 2, 6, 320};
    case DType::q5_1: return {2, 4, 8, 320};
    case DType::mxfp4: return {-1, -1, 1, 256};  // the E8M0 exponent becomes an F16 scale
    default: return {};  // Q4_0, IQ4_NL
  }
}
// Blocks come in pairs (kernel_table.h): both quants, both scales, both mins.
size_t x16_pair_bytes(const X16Fields& f) { return 2 * f.qs_bytes + (f.m >= 0 ? 128 : 64); }
size_t x16_qs_at(const X16Fields& f, int64_t b) {
  return (size_t)(b / 2) * x16_pair_bytes(f) + (size_t)(b % 2) * f.qs_bytes;
}
size_t x16_d_at(const X16Fields& f, int64_t b) {
  return (size_t)(b / 2) * x16_pair_bytes(f) + 2 * f.qs_bytes + (size_t)(b % 2) * 32;
}
bool x16_layout(DType t) {
  switch (t) {
    case DType::q4_0: case DType::iq4_nl: case DType::q8_0: case DType::q4_1: case DType::q5_0: case DType::q5_1:
    case DType::mxfp4:
      return true;
    default:
      return false;
  }
}

// MXFP4's scale 2^(e - 128) as F16 bits, exactly, for e in [104, 143]
// (2^-24 .. 2^15); -1 outside.
int mxfp4_f16_scale(uint8_t e) {
  const int k = (int)e - 128;
  if (k < -24 || k > 15) return -1;
  return k >= -14 ? (k + 15) << 10 : 1 << (k + 24);
}
uint8_t mxfp4_e_of_f16(uint16_t h) {
  if (h == 0) return 0;  // an all-zero block (see PackedMatrix::packable_data)
  if (h < 0x0400) {      // subnormal: 2^(k + 24) = h
    int k = -24;
    while ((1 << (k + 24)) != h) ++k;
    return (uint8_t)(k + 128);
  }
  return (uint8_t)(((int)(h >> 10) - 15) + 128);
}

// Row l's block b of an X16 group <-> its stored block. The fifth bits go to
// the 64 bytes after the nibbles: byte 4l + j, bit k = element 4k + j's.
void x16_put(DType t, uint8_t* group, int64_t b, int l, const uint8_t* blk) {
  const X16Fields f = x16_fields(t);
  const int nk = f.qh >= 0 ? 4 : (int)(f.qs_bytes / 64);
  uint8_t* q = group + x16_qs_at(f, b);
  for (int k = 0; k < nk; ++k) std::memcpy(q + 64 * k + 4 * l, blk + f.qs + 4 * k, 4);
  if (t == DType::q8_0)  // stored biased: element + 128 as an unsigned byte (kernel_table.h)
    for (int k = 0; k < nk; ++k)
      for (int j = 0; j < 4; ++j) q[64 * k + 4 * l + j] ^= 0x80;
  if (f.qh >= 0) {
    uint32_t qh;
    std::memcpy(&qh, blk + f.qh, 4);
    for (int j = 0; j < 4; ++j) {
      uint8_t v = 0;
      for (int k = 0; k < 8; ++k) v |= (uint8_t)(((qh >> (4 * k + j)) & 1) << k);
      q[256 + 4 * l + j] = v;
    }
  }
  if (t == DType::mxfp4) {
    const int h = mxfp4_f16_scale(blk[0]);
    const uint16_t d = (uint16_t)(h < 0 ? 0 : h);  // only all-zero blocks are out of range here
    std::memcpy(group + x16_d_at(f, b) + 2 * l, &d, 2);
    return;
  }
  std::memcpy(group + x16_d_at(f, b) + 2 * l, blk, 2);
  if (f.m >= 0) std::memcpy(group + x16_d_at(f, b) + 64 + 2 * l, blk + f.m, 2);
}
void x16_get(DType t, const uint8_t* group, int64_t b, int l, uint8_t* blk) {
  const X16Fields f = x16_fields(t);
  const int nk = f.qh >= 0 ? 4 : (int)(f.qs_bytes / 64);
  const uint8_t* q = group + x16_qs_at(f, b);
  for (int k = 0; k < nk; ++k) std::memcpy(blk + f.qs + 4 * k, q + 64 * k + 4 * l, 4);
  if (t == DType::q8_0)
    for (int k = 0; k < 4 * nk; ++k) blk[f.qs + k] ^= 0x80;
  if (f.qh >= 0) {
    uint32_t qh = 0;
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 8; ++k) qh |= (uint32_t)((q[256 + 4 * l + j] >> k) & 1) << (4 * k + j);
    std::memcpy(blk + f.qh, &qh, 4);
  }
  if (t == DType::mxfp4) {
    uint16_t d;
    std::memcpy(&d, group + x16_d_at(f, b) + 2 * l, 2);
    blk[0] = mxfp4_e_of_f16(d);
    return;
  }
  std::memcpy(blk, group + x16_d_at(f, b) + 2 * l, 2);
  if (f.m >= 0) std::memcpy(blk + f.m, group + x16_d_at(f, b) + 64 + 2 * l, 2);
}
bool is_float16(DType t) { return t == DType::f16 || t == DType::bf16; }
}  // namespace

size_t PackedMatrix::group_bytes() const {
  if (is_float16(type_)) return (size_t)cols_ * 32;
  if (const size_t sb = detail::kx16_sb_bytes(type_)) return (size_t)(cols_ / 256) * sb;
  return (size_t)((cols_ / 32 + 1) / 2) * x16_pair_bytes(x16_fields(type_));
}

void PackedMatrix::Free::operator()(uint8_t* p) const {
  if (mapped) munmap(p, mapped);
  else std::free(p);
}

bool PackedMatrix::packable(DType t) {
  return x16_layout(t) || is_float16(t) || detail::kx16_sb_bytes(t) != 0;
}

bool PackedMatrix::packable_data(DType t, const void* w, int64_t rows, int64_t cols) {
  if (!packable(t)) return false;
  if (t != DType::mxfp4) return true;
  // The packed layout holds the scale as F16: every block's 2^(e - 128) must
  // be one exactly, or the block all zeros.
  const auto* b = static_cast<const block_mxfp4*>(w);
  for (int64_t i = 0; i < rows * (cols / 32); ++i) {
    if (mxfp4_f16_scale(b[i].e) >= 0) continue;
    for (uint8_t q : b[i].qs)
      if ((q & 7) != 0 || (q >> 4 & 7) != 0) return false;
  }
  return true;
}

PackedMatrix PackedMatrix::pack(DType t, const void* w, int64_t rows, int64_t cols) {
  static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q8_0) == 34 && offsetof(block_q8_0, qs) == 2);
  static_assert(sizeof(block_iq4_nl) == 18 && offsetof(block_iq4_nl, qs) == 2);
  static_assert(offsetof(block_q4_1, m) == 2 && offsetof(block_q4_1, qs) == 4);
  static_assert(offsetof(block_q5_0, qh) == 2 && offsetof(block_q5_0, qs) == 6);
  static_assert(offsetof(block_q5_1, m) == 2 && offsetof(block_q5_1, qh) == 4 && offsetof(block_q5_1, qs) == 8);
  const size_t sb_bytes = detail::kx16_sb_bytes(t);
  const int64_t bs = sb_bytes ? 256 : is_float16(t) ? 1 : 32;
  SERVAL_ASSERT(packable(t) && rows >= 0 && cols >= 0 && cols % bs == 0);
  PackedMatrix p;
  p.type_ = t;
  p.rows_ = rows;
  p.cols_ = cols;
  const int64_t groups = (rows + detail::kX16Rows - 1) / detail::kX16Rows;
  const int64_t nb = cols / bs;
  const size_t gb = p.group_bytes(), blk_bytes = row_size(t, bs);
  p.bytes_ = (size_t)groups * gb;
  // Matrices of 256 KiB and more get an anonymous mapping of their own, so
  // that unloading a model returns their memory at once. From the heap it
  // depended on malloc_trim: after one large free glibc raises its mmap
  // threshold (up to 32 MiB) and the next model's matrices came from arenas
  // (docs/ROUTER.md). From 2 MiB up they ask for transparent huge pages
  // (THP "madvise" mode): 512x fewer page faults while packing and fewer TLB
  // misses while streaming. A fresh mapping reads as zeros, as the padding
  // rows must.
  constexpr size_t kHuge = size_t(2) << 20, kOwnMapping = size_t(256) << 10;
  const bool huge = p.bytes_ >= kHuge;
  const size_t align = huge ? kHuge : 64;
  const size_t alloc = std::max<size_t>((p.bytes_ + align - 1) / align * align, 64);
  if (alloc >= kOwnMapping) {
    // Over-map by the alignment and unmap the slack on both sides.
    const size_t span = alloc + (huge ? align : 0);
    void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SERVAL_ASSERT(m != MAP_FAILED);
    const uintptr_t base = reinterpret_cast<uintptr_t>(m);
    const uintptr_t start = (base + align - 1) / align * align;
    if (start > base) munmap(m, start - base);
    if (base + span > start + alloc) munmap(reinterpret_cast<void*>(start + alloc), base + span - (start + alloc));
    p.buf_ = std::unique_ptr<uint8_t, Free>(reinterpret_cast<uint8_t*>(start), Free(alloc));
#ifdef MADV_HUGEPAGE
    if (huge) madvise(p.buf_.get(), alloc, MADV_HUGEPAGE);  // advice only: ignored where THP is off
#endif
  } else {
    p.buf_.reset(static_cast<uint8_t*>(std::aligned_alloc(align, alloc)));
    SERVAL_ASSERT(p.buf_ != nullptr);
    std::memset(p.buf_.get(), 0, alloc);
  }
  const auto* src = static_cast<const uint8_t*>(w);
  if (is_float16(t)) {  // [group][column][16 rows] of 2 bytes; written in order
    for (int64_t g = 0; g < groups; ++g) {
      auto* dst = reinterpret_cast<uint16_t*>(p.buf_.get() + (size_t)g * gb);
      const int64_t nl = std::min<int64_t>(16, rows - 16 * g);
      const uint8_t* first = src + (size_t)(16 * g) * (size_t)cols * 2;
      for (int64_t k = 0; k < cols; ++k)
        for (int64_t l = 0; l < nl; ++l) std::memcpy(dst + 16 * k + l, first + ((size_t)l * (size_t)cols + (size_t)k) * 2, 2);
    }
    return p;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b)
      if (sb_bytes)
        detail::kx16_put(t, p.buf_.get() + (size_t)(r / 16) * gb + (size_t)b * sb_bytes, (int)(r % 16),
                         src + (size_t)(r * nb + b) * blk_bytes);
      else
        x16_put(t, p.buf_.get() + (size_t)(r / 16) * gb, b, (int)(r % 16), src + (size_t)(r * nb + b) * blk_bytes);
  return p;
}

void PackedMatrix::dequantize_row(int64_t r, float* out) const {
  SERVAL_ASSERT(r >= 0 && r < rows_);
  const uint8_t* g = buf_.get() + (size_t)(r / 16) * group_bytes();
  if (is_float16(type_)) {
    std::vector<uint16_t> row((size_t)cols_);
    for (int64_t k = 0; k < cols_; ++k) std::memcpy(&row[(size_t)k], g + (size_t)k * 32 + (size_t)(r % 16) * 2, 2);
    ref::dequantize_row(type_, row.data(), out, cols_);
    return;
  }
  if (const size_t sb = detail::kx16_sb_bytes(type_)) {
    uint8_t blk[256];
    for (int64_t b = 0; b < cols_ / 256; ++b) {
      detail::kx16_get(type_, g + (size_t)b * sb, (int)(r % 16), blk);
      ref::dequantize_row(type_, blk, out + b * 256, 256);
    }
    return;
  }
  const int64_t nb = cols_ / 32;
  uint8_t blk[34] = {};
  for (int64_t b = 0; b < nb; ++b) {
    x16_get(type_, g, b, (int)(r % 16), blk);
    ref::dequantize_row(type_, blk, out + b * 32, 32);
  }
}

void matmul(const PackedMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  const int64_t rows = w.rows(), cols = w.cols();
  if (rows <= 0 || n <= 0) return;
  const detail::KernelTable* tab = table();
  const detail::MatmulKernel k = tab ? tab->packed_kernel(w.type()) : detail::MatmulKernel{};
  if (k.fn == nullptr) {
    auto work = [&](int64_t r0, int64_t r1) {
      thread_local std::vector<float> row;
      if ((int64_t)row.size() < cols) row.resize((size_t)cols);
      for (int64_t r = r0; r < r1; ++r) {
        w.dequantize_row(r, row.data());
        for (int64_t i = 0; i < n; ++i) y[i * rows + r] = dot_f32(row.data(), x + i * cols, cols);
      }
    };
    if (pool) pool->parallel_for(rows, work, 16);
    else work(0, rows);
    return;
  }
  detail::MatmulTask task{.w = w.data(), .w_stride = w.group_bytes(), .rows = rows, .cols = cols, .x = x, .n = n,
                          .y = y};
  const bool parallel = pool != nullptr && pool->n_threads() > 1;
  if (k.act == detail::ActKind::f32) {
    run_rows(k.fn, task, w.group_bytes(), parallel ? pool : nullptr);
    return;
  }
  task.act_stride = packed_act_row_bytes(k, cols);
  uint8_t* act = act_scratch(task.act_stride * (size_t)n);
  task.act = act;
  auto quantize = [&](int64_t i0, int64_t i1) { quantize_packed_act(tab, k, x, cols, i0, i1, act); };
  if (parallel && n * cols >= (1 << 18)) pool->parallel_for(n, quantize);
  else quantize(0, n);
  run_rows(k.fn, task, w.group_bytes(), parallel ? pool : nullptr);
}

void matmul_many(const PackedProduct* products, size_t count, const float* x, int64_t n, ThreadPool* pool) {
  if (count == 0 || n <= 0) return;
  const detail::KernelTable* tab = table();
  const int64_t cols = products[0].w->cols();
  // Up to kMax products in one call. More, or any product without a fast
  // kernel (the ref level) or of other cols, go one by one through matmul.
  constexpr size_t kMax = 8;
  struct Part {
    detail::MatmulKernel k;
    detail::MatmulTask task;
    int64_t u0, u1;  // its 16-row units in the joint index
    int format;      // index of its activation format in `formats`
  };
  Part parts[kMax];
  detail::MatmulKernel formats[kMax];
  int n_formats = 0;
  bool fused = tab != nullptr && count <= kMax;
  int64_t units = 0;
  for (size_t j = 0; fused && j < count; ++j) {
    const PackedMatrix& w = *products[j].w;
    Part& pt = parts[j];
    pt.k = tab->packed_kernel(w.type());
    if (pt.k.fn == nullptr || w.cols() != cols) {
      fused = false;
      break;
    }
    pt.task = detail::MatmulTask{.w = w.data(), .w_stride = w.group_bytes(), .rows = w.rows(), .cols = cols, .x = x,
                                 .n = n, .y = products[j].y};
    pt.u0 = units;
    units += (w.rows() + 15) / 16;
    pt.u1 = units;
    pt.format = -1;
    if (pt.k.act == detail::ActKind::f32) continue;  // reads X as given
    for (int f = 0; f < n_formats; ++f)
      if (formats[f].act == pt.k.act && formats[f].act_offset == pt.k.act_offset) pt.format = f;
    if (pt.format < 0) {
      pt.format = n_formats;
      formats[n_formats++] = pt.k;
    }
  }
  if (!fused) {
    for (size_t j = 0; j < count; ++j) matmul(*products[j].w, x, n, products[j].y, pool);
    return;
  }
  const bool parallel = pool != nullptr && pool->n_threads() > 1;

  // Each activation format once, in one scratch buffer (64-byte aligned parts).
  size_t offsets[kMax], total = 0;
  for (int f = 0; f < n_formats; ++f) {
    offsets[f] = total;
    total += (packed_act_row_bytes(formats[f], cols) * (size_t)n + 63) / 64 * 64;
  }
  uint8_t* act = n_formats > 0 ? act_scratch(total) : nullptr;
  for (size_t j = 0; j < count; ++j)
    if (parts[j].format >= 0) {
      parts[j].task.act = act + offsets[parts[j].format];
      parts[j].task.act_stride = packed_act_row_bytes(parts[j].k, cols);
    }
  if (n_formats > 0) {
    // Item q = f * n + i: format f of row i. Rows are independent, so any
    // split gives the same bytes; a split pays from about 32K elements (a
    // 16-sequence decode step's activations: ~30 µs of work on one thread).
    auto quantize = [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const int f = (int)(q / n);
        const int64_t i = q % n;
        quantize_packed_act(tab, formats[f], x, cols, i, i + 1, act + offsets[f]);
      }
    };
    const int64_t items = (int64_t)n_formats * n;
    if (parallel && items >= 2 && items * cols >= (1 << 15)) pool->parallel_for(items, quantize);
    else quantize(0, items);
  }

  // All products' rows in one index of 16-row units: a chunk runs the part
  // of each product it covers (run_rows' grain, from the common cols).
  auto rows_of = [&](int64_t u0, int64_t u1) {
    for (size_t j = 0; j < count; ++j) {
      const Part& pt = parts[j];
      const int64_t lo = std::max(u0, pt.u0), hi = std::min(u1, pt.u1);
      if (lo < hi) pt.k.fn(pt.task, (lo - pt.u0) * 16, std::min(pt.task.rows, (hi - pt.u0) * 16));
    }
  };
  if (!parallel) {
    rows_of(0, units);
    return;
  }
  size_t bytes = 0;
  for (size_t j = 0; j < count; ++j) bytes += products[j].w->bytes();
  const int64_t per_unit = unit_work(16 * cols * n, bytes / (size_t)units);
  pool->parallel_for(units, rows_of, std::max<int64_t>(1, kMinChunkMacs / per_unit));
}

void matmul_grouped(const GroupedProduct* products, size_t count, ThreadPool* pool) {
  const detail::KernelTable* tab = table();
  struct Part {
    detail::MatmulKernel k;
    detail::MatmulTask task;
    const int64_t* rows;  // gathered from source `src`'s quantized rows; else its own
    int src;
    int64_t u1;      // end of its 16-row units in the joint index
    size_t act_off;  // its quantized rows in the scratch buffer
  };
  // An input that products gather rows from, quantized once per format.
  struct Source {
    const float* x;
    detail::MatmulKernel k;
    int64_t cols, n;  // rows [0, n) of x
    size_t act_off;
  };
  // Items of the quantization pass: rows [q0, q1) of the joint index are rows
  // [0, q1 - q0) of x, quantized for k, to act + act_off.
  struct QuantRun {
    const float* x;
    detail::MatmulKernel k;
    int64_t cols, q1;
    size_t act_off, stride;
  };
  // (The caller's scratch: a thread_local named inside the lambdas below
  // would be each worker's own, so they reach it through these references.)
  thread_local std::vector<Part> parts_tl;
  thread_local std::vector<Source> sources_tl;
  thread_local std::vector<QuantRun> runs_tl;
  std::vector<Part>& parts = parts_tl;
  std::vector<Source>& sources = sources_tl;
  std::vector<QuantRun>& runs = runs_tl;
  parts.clear();
  sources.clear();
  runs.clear();
  bool fused = tab != nullptr;
  int64_t units = 0, macs = 0;
  size_t act_bytes = 0, f32_floats = 0, bytes = 0;
  auto take = [&act_bytes](size_t bytes) {
    const size_t at = act_bytes;
    act_bytes += (bytes + 63) / 64 * 64;
    return at;
  };
  for (size_t j = 0; j < count && fused; ++j) {
    const GroupedProduct& gp = products[j];
    if (gp.n <= 0 || gp.w->rows() <= 0) continue;
    Part pt;
    pt.k = tab->packed_kernel(gp.w->type());
    if (pt.k.fn == nullptr) {
      fused = false;
      break;
    }
    const int64_t cols = gp.w->cols();
    pt.task = detail::MatmulTask{.w = gp.w->data(), .w_stride = gp.w->group_bytes(), .rows = gp.w->rows(),
                                 .cols = cols, .x = gp.x, .n = gp.n, .y = gp.y};
    units += (gp.w->rows() + 15) / 16;
    pt.u1 = units;
    macs += gp.w->rows() * cols * gp.n;
    bytes += gp.w->bytes();
    pt.rows = nullptr;
    pt.src = -1;
    if (pt.k.act == detail::ActKind::f32) {
      if (gp.rows) {  // reads X as given: its rows gathered in F32 (below)
        pt.rows = gp.rows;
        pt.act_off = f32_floats;
        f32_floats += (size_t)(gp.n * cols);
      }
    } else {
      pt.task.act_stride = packed_act_row_bytes(pt.k, cols);
      pt.act_off = take(pt.task.act_stride * (size_t)gp.n);
      if (gp.rows) {
        pt.rows = gp.rows;
        int64_t n_src = 0;
        for (int64_t i = 0; i < gp.n; ++i) n_src = std::max(n_src, gp.rows[i] + 1);
        for (size_t s = 0; s < sources.size() && pt.src < 0; ++s)
          if (sources[s].x == gp.x && sources[s].k.act == pt.k.act && sources[s].k.act_offset == pt.k.act_offset &&
              sources[s].cols == cols)
            pt.src = (int)s;
        if (pt.src < 0) {
          pt.src = (int)sources.size();
          sources.push_back({gp.x, pt.k, cols, 0, 0});
        }
        sources[(size_t)pt.src].n = std::max(sources[(size_t)pt.src].n, n_src);
      }
    }
    parts.push_back(pt);
  }
  if (!fused) {
    // One by one (rows gathered in F32 first where given).
    thread_local std::vector<float> gathered;
    for (size_t j = 0; j < count; ++j) {
      const GroupedProduct& gp = products[j];
      if (gp.n <= 0) continue;
      const float* x = gp.x;
      if (gp.rows) {
        const int64_t cols = gp.w->cols();
        gathered.resize((size_t)(gp.n * cols));
        for (int64_t i = 0; i < gp.n; ++i)
          std::memcpy(gathered.data() + i * cols, gp.x + gp.rows[i] * cols, (size_t)cols * sizeof(float));
        x = gathered.data();
      }
      matmul(*gp.w, x, gp.n, gp.y, pool);
    }
    return;
  }
  if (parts.empty()) return;
  const bool parallel = pool != nullptr && pool->n_threads() > 1;
  if (f32_floats > 0) {
    // F16/BF16/F32 weights gathering rows: their F32 rows, copied.
    thread_local std::vector<float> gathered_tl;
    std::vector<float>& gathered = gathered_tl;
    if (gathered.size() < f32_floats) gathered.resize(f32_floats);
    for (Part& pt : parts)
      if (pt.rows && pt.k.act == detail::ActKind::f32) {
        float* dst = gathered.data() + pt.act_off;
        for (int64_t i = 0; i < pt.task.n; ++i)
          std::memcpy(dst + i * pt.task.cols, pt.task.x + pt.rows[i] * pt.task.cols,
                      (size_t)pt.task.cols * sizeof(float));
        pt.task.x = dst;
      }
  }

  // What to quantize: each source once, then the rows of each product that
  // has its own X.
  int64_t q_rows = 0, q_elems = 0;
  for (Source& s : sources) {
    const size_t stride = packed_act_row_bytes(s.k, s.cols);
    s.act_off = take(stride * (size_t)s.n);
    q_rows += s.n;
    q_elems += s.n * s.cols;
    runs.push_back({s.x, s.k, s.cols, q_rows, s.act_off, stride});
  }
  for (const Part& pt : parts)
    if (pt.k.act != detail::ActKind::f32 && pt.rows == nullptr) {
      q_rows += pt.task.n;
      q_elems += pt.task.n * pt.task.cols;
      runs.push_back({pt.task.x, pt.k, pt.task.cols, q_rows, pt.act_off, pt.task.act_stride});
    }
  uint8_t* act = act_bytes > 0 ? act_scratch(act_bytes) : nullptr;
  for (Part& pt : parts)
    if (pt.k.act != detail::ActKind::f32) pt.task.act = act + pt.act_off;
  if (q_rows > 0) {
    // Rows are independent, so any split gives the same bytes.
    auto quantize = [&](int64_t q0, int64_t q1) {
      auto it = std::upper_bound(runs.begin(), runs.end(), q0,
                                 [](int64_t v, const QuantRun& r) { return v < r.q1; });
      for (; it != runs.end() && q0 < q1; ++it) {
        const int64_t first = it == runs.begin() ? 0 : (it - 1)->q1;
        const int64_t hi = std::min(q1, it->q1);
        quantize_packed_act(tab, it->k, it->x, it->cols, q0 - first, hi - first, act + it->act_off);
        q0 = hi;
      }
    };
    if (parallel && q_rows >= 2 && q_elems >= (1 << 15)) pool->parallel_for(q_rows, quantize);
    else quantize(0, q_rows);
    // The gathering products' rows, copied from their sources' (a few KB each).
    for (const Part& pt : parts)
      if (pt.rows && pt.src >= 0) {
        const Source& s = sources[(size_t)pt.src];
        for (int64_t i = 0; i < pt.task.n; ++i)
          std::memcpy(act + pt.act_off + (size_t)i * pt.task.act_stride,
                      act + s.act_off + (size_t)pt.rows[i] * pt.task.act_stride, pt.task.act_stride);
      }
  }

  auto rows_of = [&](int64_t u0, int64_t u1) {
    auto it = std::upper_bound(parts.begin(), parts.end(), u0, [](int64_t v, const Part& p) { return v < p.u1; });
    for (; it != parts.end(); ++it) {
      const Part& pt = *it;
      const int64_t first = pt.u1 - (pt.task.rows + 15) / 16;
      if (first >= u1) break;
      const int64_t lo = std::max(u0, first), hi = std::min(u1, pt.u1);
      pt.k.fn(pt.task, (lo - first) * 16, std::min(pt.task.rows, (hi - first) * 16));
    }
  };
  if (!parallel) {
    rows_of(0, units);
    return;
  }
  const int64_t per_unit = unit_work(macs / units, bytes / (size_t)units);
  pool->parallel_for(units, rows_of, std::max<int64_t>(1, kMinChunkMacs / per_unit));
}

void attention(const float* q, const float* const* k_blocks, const float* const* v_blocks, int32_t block_size,
               int64_t kv_stride, int64_t n_ctx, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale,
               float* out, float* scratch) {
  const detail::KernelTable* tab = table();
  if (tab == nullptr) {
    attention_ref(q, k_blocks, v_blocks, block_size, kv_stride, n_ctx, n_heads, n_kv_heads, head_dim, scale, out,
                  scratch);
    return;
  }
  const int32_t group = n_heads / n_kv_heads;
  float* scores = scratch;
  if (group > 1) {
    thread_local std::vector<float> buf;
    if ((int64_t)buf.size() < group * n_ctx) buf.resize((size_t)(group * n_ctx));
    scores = buf.data();
  }
  tab->attention(q, k_blocks, v_blocks, block_size, kv_stride, n_ctx, n_heads, n_kv_heads, head_dim, scale, out,
                 scores);
}

}  // namespace serval::kernels
