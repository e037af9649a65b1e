// Observer of the matrix products of a forward pass (importance-matrix
// collection): called on the forward's thread, before each product, with the
// matrix and its input rows `in` [rows, m.cols]. The forwards skip it (one
// null-pointer test per product) when none is set.
#pragma once

#include <cstdint>
#include <functional>

#include "model/model.h"

namespace serval {

using MatmulObserver = std::function<void(const Matrix& m, const float* in, int64_t rows)>;

}  // namespace serval
