// KvStorage: the memory of the paged KV cache — K and V of every layer for a
// pool of fixed-size blocks, plus an optional host swap area. The allocator
// (KvCacheManager) decides which block ids a sequence owns; this class only
// holds the bytes and moves whole blocks (copy-on-write, swap).
//
// Layout: for each layer, K and V are [n_blocks, block_size] rows of
// row_bytes() bytes (kv_dim elements stored as the geometry's KvType,
// tensor/kv_type.h), so a block's K for one layer is one contiguous run of
// block_bytes(). Copies and swaps move bytes, so they work for every type.
//
// Two pools: the main pool holds the full-attention layers; the layers the
// geometry puts in the sliding-window pool (swa_layers) have blocks of their
// own, with their own ids (a sequence's second block table), so that blocks
// every sliding-window layer has slid past can be freed for those layers
// alone (kv_cache_manager.h). Without swa_layers every layer is in the main
// pool. k(layer, b) takes b in the pool of that layer.
//
// Allocated once at construction. Written by the runner (engine loop thread)
// only; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kv_cache/kv_types.h"
#include "tensor/kv_type.h"

namespace serval {

struct KvGeometry {
  KvGeometry() = default;
  KvGeometry(int32_t layers, int32_t dim, int32_t block = 16, KvType t = KvType::f32, std::vector<uint8_t> swa = {})
      : n_layers(layers), kv_dim(dim), block_size(block), type(t), swa_layers(std::move(swa)) {}

  int32_t n_layers = 0;
  int32_t kv_dim = 0;       // n_kv_heads * head_dim
  int32_t block_size = 16;  // tokens per block
  KvType type = KvType::f32;
  std::vector<uint8_t> swa_layers;  // [n_layers]: 1 = the layer's K/V live in the sliding-window pool; empty: none

  bool in_swa_pool(int32_t layer) const { return !swa_layers.empty() && swa_layers[(size_t)layer] != 0; }
  int32_t n_swa_layers() const {
    int32_t n = 0;
    for (uint8_t s : swa_layers) n += s != 0;
    return n;
  }
  // Bytes of one token's K (or V) row in one layer.
  size_t row_bytes() const { return kv_row_bytes(type, kv_dim); }
  // Bytes one block takes across all layers (K and V), as if in one pool.
  size_t bytes_per_block() const { return (size_t)n_layers * 2 * (size_t)block_size * row_bytes(); }
  // Bytes a block of the main pool (full-attention layers) / the sliding-window pool takes.
  size_t bytes_per_main_block() const { return (size_t)(n_layers - n_swa_layers()) * 2 * (size_t)block_size * row_bytes(); }
  size_t bytes_per_swa_block() const { return (size_t)n_swa_layers() * 2 * (size_t)block_size * row_bytes(); }
  size_t bytes_per_token() const { return (size_t)n_layers * 2 * row_bytes(); }
};

class KvStorage {
 public:
  // n_swa_blocks: blocks of the sliding-window pool (>= 1 when the geometry
  // has swa_layers, else 0); the swap area covers the main pool's layers and
  // needs a geometry without swa_layers. Errors: invalid_argument for a bad
  // geometry or count, resource_exhausted when the allocation fails.
  static Expected<KvStorage> create(KvGeometry g, int32_t n_blocks, int32_t n_host_blocks = 0,
                                    int32_t n_swa_blocks = 0);

  const KvGeometry& geometry() const { return g_; }
  int32_t n_blocks() const { return n_blocks_; }
  int32_t n_swa_blocks() const { return n_swa_blocks_; }
  bool has_swa_pool() const { return n_swa_blocks_ > 0; }
  int32_t n_host_blocks() const { return n_host_blocks_; }

  // K (or V) rows of one block in one layer: block_size rows of row_bytes();
  // b is an id of the layer's pool.
  uint8_t* k(int32_t layer, BlockId b) { return data_.get() + offset(layer, 0, b); }
  uint8_t* v(int32_t layer, BlockId b) { return data_.get() + offset(layer, 1, b); }
  const uint8_t* k(int32_t layer, BlockId b) const { return data_.get() + offset(layer, 0, b); }
  const uint8_t* v(int32_t layer, BlockId b) const { return data_.get() + offset(layer, 1, b); }

  void copy_block(const BlockCopy& c);         // every layer of c's pool, K and V
  void swap_out(const BlockSwap& s);           // device block -> host slot
  void swap_in(const BlockSwap& s);            // host slot -> device block

 private:
  size_t block_bytes() const { return (size_t)g_.block_size * g_.row_bytes(); }
  size_t offset(int32_t layer, int kv, BlockId b) const {
    const bool swa = g_.in_swa_pool(layer);
    SERVAL_ASSERT(b >= 0 && b < (swa ? n_swa_blocks_ : n_blocks_));
    const size_t base = swa ? main_bytes_ : 0;
    return base + (((size_t)slot_[(size_t)layer] * 2 + (size_t)kv) * (size_t)(swa ? n_swa_blocks_ : n_blocks_) +
                   (size_t)b) * block_bytes();
  }

  KvGeometry g_;
  int32_t n_blocks_ = 0;
  int32_t n_swa_blocks_ = 0;
  int32_t n_host_blocks_ = 0;
  std::vector<int32_t> slot_;  // [n_layers]: the layer's index within its pool
  size_t main_bytes_ = 0;      // bytes of the main pool (the sliding-window pool follows it)
  // Left uninitialized (every slot is written before it is read), so a large
  // pool costs no start-up time and pages are committed as they are used.
  std::unique_ptr<uint8_t[]> data_;  // device pool
  std::unique_ptr<uint8_t[]> host_;  // swap area: [n_host_blocks, n_layers, 2, block_bytes()]
};

}  // namespace serval
