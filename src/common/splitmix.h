// splitmix64 (Steele, Lea & Flood, 2014): a 64-bit counter run through a
// mixing function. A tiny, portable, seeded generator that gives the same
// stream on every machine; used to seed xoshiro (sampler/rng.h), to draw
// synthetic weights and to build reproducible benchmark prompts.
#pragma once

#include <cstdint>

namespace serval {

// Advances `state` and returns the next output.
inline uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace serval
