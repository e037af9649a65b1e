#include "kv_cache/kv_storage.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace serval {

Expected<KvStorage> KvStorage::create(KvGeometry g, int32_t n_blocks, int32_t n_host_blocks) {
  if (g.n_layers <= 0 || g.kv_dim <= 0 || g.block_size <= 0 || n_blocks <= 0 || n_host_blocks < 0 ||
      g.kv_dim % kv_type_block(g.type) != 0)
    return invalid_argument("KV storage: invalid geometry or block count");
  KvStorage s;
  s.g_ = g;
  s.n_blocks_ = n_blocks;
  s.n_host_blocks_ = n_host_blocks;
  s.data_.reset(new (std::nothrow) uint8_t[(size_t)n_blocks * g.bytes_per_block()]);
  s.host_.reset(new (std::nothrow) uint8_t[std::max<size_t>(1, (size_t)n_host_blocks * g.bytes_per_block())]);
  if (!s.data_ || !s.host_) {
    return Status(StatusCode::resource_exhausted,
                  "cannot allocate " + std::to_string((size_t)n_blocks * g.bytes_per_block()) + " bytes of KV cache");
  }
  return s;
}

void KvStorage::copy_block(BlockId src, BlockId dst) {
  SERVAL_ASSERT(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_);
  for (int32_t l = 0; l < g_.n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      std::memcpy(data_.get() + offset(l, kv, dst), data_.get() + offset(l, kv, src), block_bytes());
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
