// TensorLoader: the families' access to a GGUF file's tensors. Every lookup
// checks the tensor's shape (ggml order; trailing 1s ignored) and that its type
// is one serval runs, and marks the tensor used. After loading, unused()
// lists the tensors no family code asked for: the model refuses them (a tensor
// the family does not use would change the math) unless the family declared
// them harmless with ignore(), which records a warning naming them.
//
// Single-threaded; lives for one Model::load.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "model/weights.h"

namespace serval {

class TensorLoader {
 public:
  explicit TensorLoader(const gguf::GgufFile& f) : f_(f) {}

  // The tensor `name` of exactly `dims`; null when missing and optional, else
  // not_found. Errors name the tensor and the expected vs actual shape.
  Expected<const gguf::TensorInfo*> get(const std::string& name, const std::vector<int64_t>& dims, bool optional);
  // A [rows, cols] matrix (GGUF dims {cols, rows}) as a view into the mapping.
  Status matrix(const std::string& name, int64_t rows, int64_t cols, Matrix* out, bool optional = false);
  // A vector of n elements widened to F32 (left empty when optional and missing).
  Status vec(const std::string& name, int64_t n, std::vector<float>* out, bool optional = false);
  // A 3-D [n, rows, cols] stack of n matrices (GGUF dims {cols, rows, n}),
  // as n views of consecutive slices.
  Status matrices(const std::string& name, int64_t n, int64_t rows, int64_t cols, std::vector<Matrix>* out);
  // n vectors of len elements (GGUF dims {len, n}), widened to F32, [n * len].
  Status vecs(const std::string& name, int64_t n, int64_t len, std::vector<float>* out);
  bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }

  // Declares `name` (if present) known-harmless: not used, not an error; a
  // warning naming it and `why` is recorded.
  void ignore(const std::string& name, const std::string& why);
  // Tensors of the file that were neither loaded nor ignored, in file order.
  std::vector<std::string> unused() const;
  const std::vector<std::string>& warnings() const { return warnings_; }
  const gguf::GgufFile& file() const { return f_; }

 private:
  const gguf::GgufFile& f_;
  std::unordered_set<std::string> used_;
  std::vector<std::string> warnings_;
};

// "[a, b, c]".
std::string shape_str(const std::vector<int64_t>& dims);

}  // namespace serval
