#include "sampler/rng.h"

#include <random>

#include "common/splitmix.h"
#include "common/status.h"

namespace serval {

namespace {
constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

uint64_t SplitMix64::next() { return splitmix64_next(state_); }

Rng::Rng(uint64_t seed) {
  SplitMix64 sm(seed);
  for (uint64_t& w : s_) w = sm.next();
  // splitmix64 is a bijection of its counter, so four successive outputs
  // are never all zero; keep the invariant explicit anyway.
  SERVAL_ASSERT(s_[0] | s_[1] | s_[2] | s_[3]);
}

Rng Rng::from_state(const std::array<uint64_t, 4>& state) {
  SERVAL_ASSERT(state[0] | state[1] | state[2] | state[3]);
  Rng r;
  r.s_ = state;
  return r;
}

uint64_t Rng::os_seed() {
  std::random_device rd;
  // random_device yields 32-bit values; combine two.
  const uint64_t hi = static_cast<uint32_t>(rd());
  const uint64_t lo = static_cast<uint32_t>(rd());
  return (hi << 32) | lo;
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() {
  // 53 bits fit a double's mantissa exactly; the product by a power of two
  // is exact too.
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

}  // namespace serval
