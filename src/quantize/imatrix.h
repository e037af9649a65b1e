// Importance matrices: for every weight matrix, the sum over the tokens of a
// calibration text of the squared activations entering it, per input channel
// (column). The quantizer weights each column's rounding error by it.
//
// File format: llama.cpp's legacy binary imatrix ("imatrix.dat"), which is
// what users have, all little-endian:
//   int32 n_entries
//   n_entries x { int32 name_len; char name[name_len]; int32 ncall;
//                 int32 nval; float values[nval] }
//   int32 last_call; int32 dataset_len; char dataset[dataset_len]  (optional)
// values are sums of squares accumulated over ncall calls (chunks);
// llama-quantize divides them by ncall, and so does weights().
//
// Value types; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "model/matmul_observer.h"

namespace serval::quant {

struct ImatrixEntry {
  int32_t ncall = 0;
  std::vector<float> values;  // [n_cols] sums of squares
};

struct Imatrix {
  std::map<std::string, ImatrixEntry> entries;  // by tensor name
  int32_t last_call = 0;                        // chunks processed
  std::string dataset;                          // the calibration text's file name

  // Per-column weights for tensor `name` (values / ncall), or nullptr-like
  // empty vector when the tensor has no entry.
  std::vector<float> weights(const std::string& name) const;
};

// Reads a legacy imatrix file. Every count and length is bounded by the file
// size; values must be finite and >= 0. Errors: not_found, invalid_file (a GGUF
// imatrix is refused with a message saying so).
Expected<Imatrix> read_imatrix(const std::string& path);
Status write_imatrix(const Imatrix& im, const std::string& path);

// Accumulates an Imatrix from forward passes: install observer() on a
// BatchForward (or ReferenceForward) of `model`, run the chunks, call
// end_chunk() after each. output.weight is skipped (as llama-imatrix does
// without --process-output). Called on the forward's thread; not thread-safe.
class ImatrixCollector {
 public:
  explicit ImatrixCollector(const Model& model);

  const MatmulObserver* observer() const { return &observer_; }
  void end_chunk() { ++n_chunks_; }
  Imatrix result(const std::string& dataset) const;

 private:
  void observe(const Matrix& m, const float* in, int64_t rows);

  struct Acc {
    std::string name;
    std::vector<double> sums;
  };
  std::unordered_map<const Matrix*, size_t> index_;
  std::vector<Acc> acc_;
  int32_t n_chunks_ = 0;
  MatmulObserver observer_;
};

}  // namespace serval::quant
