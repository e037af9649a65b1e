// Quantizing a GGUF model file into another (serval quantize): every metadata
// key is kept in order (general.file_type and general.quantization_version are
// set; with an imatrix, llama.cpp's quantize.imatrix.* keys are added), the
// alignment is kept, and every tensor gets the type quant_policy.h chooses.
// Rows are quantized in parallel on the pool, one tensor in memory at a time.
//
// Refuses (Status, nothing written): a quantized source (unless
// allow_requantize: it is dequantized first, which compounds the error), an
// imatrix entry whose length differs from its tensor's row length, an imatrix
// that matches no tensor, tensor types serval cannot read.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "quantize/imatrix.h"
#include "quantize/quant_policy.h"

namespace serval::quant {

struct QuantizeOptions {
  FileType file_type;
  const Imatrix* imatrix = nullptr;  // optional
  std::string imatrix_path;          // recorded in quantize.imatrix.file
  bool allow_requantize = false;
  ThreadPool* pool = nullptr;
  // Called after each tensor is written (writer thread): tensors done / total, bytes done / total.
  std::function<void(size_t done, size_t total, uint64_t bytes_done, uint64_t bytes_total)> progress;
  // Called with warnings (requantizing, fallbacks), one line each.
  std::function<void(const std::string&)> warn;
};

struct QuantizeSummary {
  uint64_t in_bytes = 0, out_bytes = 0;  // tensor data
  size_t n_quantized = 0, n_copied = 0, n_imatrix = 0;
  size_t n_fallback = 0;  // tensors the row-length fallback applied to (quantized or kept)
};

Expected<QuantizeSummary> quantize_model(const std::string& in_path, const std::string& out_path,
                                         const QuantizeOptions& opt);

}  // namespace serval::quant
