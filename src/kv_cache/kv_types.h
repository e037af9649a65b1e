// Small shared types of the paged KV cache. Plain values.
#pragma once

#include <cstdint>

namespace serval {

using BlockId = int32_t;  // index of a block in the device pool, [0, n_blocks); -1: none (released)
using SeqId = int64_t;    // engine-wide id of one sequence (one sample of a request)

// Copy-on-write: the runner copies all layers' K/V of block `src` into `dst`
// (with `swa`, blocks of the sliding-window pool: its layers only).
struct BlockCopy {
  BlockId src = -1;
  BlockId dst = -1;
  bool swa = false;
  bool operator==(const BlockCopy&) const = default;
};

// Swap tier: move one block between the device pool and host swap space.
struct BlockSwap {
  BlockId device = -1;
  int32_t host = -1;
  bool operator==(const BlockSwap&) const = default;
};

// What, besides token ids, makes two prefixes' KV interchangeable.
struct PrefixKey {
  uint64_t salt = 0;        // per-tenant isolation: different salts never share blocks
  uint64_t adapter_id = 0;  // LoRA/adapter (0 = base model)
  bool operator==(const PrefixKey&) const = default;
};

}  // namespace serval
