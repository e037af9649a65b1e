// Rng: the sampler's seeded pseudo-random number generator.
//
// xoshiro256** (Blackman & Vigna, 2018) seeded through splitmix64 (Steele,
// Lea & Flood, 2014), the seeding the xoshiro authors recommend. Both are
// fully specified integer algorithms and uniform() is built from their bits
// with exact arithmetic, so a seed gives the same sequence on every compiler,
// standard library and CPU. No std:: distribution is used anywhere: their
// output differs between standard libraries.
//
// Value type, 32 bytes; copyable (a copy continues the same sequence
// independently). Not thread-safe: one Rng per sequence, used by the thread
// that samples for that sequence.
#pragma once

#include <array>
#include <cstdint>

namespace serval {

// splitmix64: a 64-bit counter run through a mixing function. Used to expand
// one 64-bit seed into xoshiro's 256-bit state.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();

 private:
  uint64_t state_;
};

class Rng {
 public:
  // State from four successive splitmix64(seed) outputs (never all zero).
  explicit Rng(uint64_t seed);

  // State given directly (for reference vectors); must not be all zero.
  static Rng from_state(const std::array<uint64_t, 4>& state);

  // A seed from the OS entropy source (std::random_device).
  static uint64_t os_seed();

  // The next 64 raw bits (xoshiro256**).
  uint64_t next_u64();

  // Uniform double in [0, 1): the top 53 bits of next_u64() times 2^-53.
  // Exact (no rounding), so identical everywhere.
  double uniform();

  const std::array<uint64_t, 4>& state() const { return s_; }

 private:
  Rng() = default;
  std::array<uint64_t, 4> s_{};
};

}  // namespace serval
