// L2 normalization of a vector (embeddings: the engine pools, the API
// normalizes). Header-only; thread-safe.
#pragma once

#include <cmath>
#include <span>

namespace serval {

// v /= |v|, accumulated in double; a zero vector stays zero.
inline void l2_normalize(std::span<float> v) {
  double ss = 0.0;
  for (float x : v) ss += (double)x * x;
  if (ss <= 0.0) return;
  const double inv = 1.0 / std::sqrt(ss);
  for (float& x : v) x = (float)(x * inv);
}

}  // namespace serval
