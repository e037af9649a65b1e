#include "kv_cache/kv_storage.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace serval {

Expected<KvStorage> KvStorage::create(KvGeometry g, int32_t n_blocks, int32_t n_host_blocks, int32_t n_swa_blocks) {
  if (g.n_layers <= 0 || g.kv_dim <= 0 || g.block_size <= 0 || n_blocks <= 0 || n_host_blocks < 0 ||
      n_swa_blocks < 0 || g.kv_dim % kv_type_block(g.type) != 0)
    return invalid_argument("KV storage: invalid geometry or block count");
  if (!g.swa_layers.empty() && (int32_t)g.swa_layers.size() != g.n_layers)
    return invalid_argument("KV storage: swa_layers has " + std::to_string(g.swa_layers.size()) + " entries for " +
                            std::to_string(g.n_layers) + " layers");
  const int32_t n_swa_layers = g.n_swa_layers();
  if ((n_swa_layers > 0) != (n_swa_blocks > 0))
    return invalid_argument("KV storage: a sliding-window pool needs sliding-window layers and blocks, got " +
                            std::to_string(n_swa_layers) + " layers and " + std::to_string(n_swa_blocks) + " blocks");
  if (n_swa_layers > 0 && n_host_blocks > 0)
    return invalid_argument("KV storage: no swap area with a sliding-window pool");
  if (n_swa_layers == 0) g.swa_layers.clear();
  KvStorage s;
  s.g_ = g;
  s.n_blocks_ = n_blocks;
  s.n_swa_blocks_ = n_swa_blocks;
  s.n_host_blocks_ = n_host_blocks;
  s.slot_.resize((size_t)g.n_layers);
  int32_t n_main = 0, n_swa = 0;
  for (int32_t l = 0; l < g.n_layers; ++l) s.slot_[(size_t)l] = g.in_swa_pool(l) ? n_swa++ : n_main++;
  s.main_bytes_ = (size_t)n_blocks * g.bytes_per_main_block();
  const size_t total = s.main_bytes_ + (size_t)n_swa_blocks * g.bytes_per_swa_block();
  s.data_.reset(new (std::nothrow) uint8_t[total]);
  s.host_.reset(new (std::nothrow) uint8_t[std::max<size_t>(1, (size_t)n_host_blocks * g.bytes_per_block())]);
  if (!s.data_ || !s.host_)
    return Status(StatusCode::resource_exhausted, "cannot allocate " + std::to_string(total) + " bytes of KV cache");
  return s;
}

void KvStorage::copy_block(const BlockCopy& c) {
  const int32_t n = c.swa ? n_swa_blocks_ : n_blocks_;
  SERVAL_ASSERT(c.src >= 0 && c.src < n && c.dst >= 0 && c.dst < n);
  for (int32_t l = 0; l < g_.n_layers; ++l) {
    if (g_.in_swa_pool(l) != c.swa) continue;
    for (int kv = 0; kv < 2; ++kv)
      std::memcpy(data_.get() + offset(l, kv, c.dst), data_.get() + offset(l, kv, c.src), block_bytes());
  }
}

void KvStorage::swap_out(const BlockSwap& s) {
  SERVAL_ASSERT(s.device >= 0 && s.device < n_blocks_ && s.host >= 0 && s.host < n_host_blocks_);
  uint8_t* dst = host_.get() + (size_t)s.host * g_.bytes_per_block();
  for (int32_t l = 0; l < g_.n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv, dst += block_bytes())
      std::memcpy(dst, data_.get() + offset(l, kv, s.device), block_bytes());
}

void KvStorage::swap_in(const BlockSwap& s) {
  SERVAL_ASSERT(s.device >= 0 && s.device < n_blocks_ && s.host >= 0 && s.host < n_host_blocks_);
  const uint8_t* src = host_.get() + (size_t)s.host * g_.bytes_per_block();
  for (int32_t l = 0; l < g_.n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv, src += block_bytes())
      std::memcpy(data_.get() + offset(l, kv, s.device), src, block_bytes());
}

}  // namespace serval
