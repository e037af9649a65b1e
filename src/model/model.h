// A loaded model: the GGUF file (mapped), its validated config and views of its
// weights, loaded by the family of general.architecture (model/family.h). Big
// matrices stay in the mapping in their stored type (no copy); small vectors
// (norms, biases) are widened to F32 at load.
//
// Immutable after load(): safe to share between threads. Move-only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace serval {

class Model {
 public:
  // Maps, validates config and every tensor's shape and type. Errors name the
  // tensor and the expected vs actual shape; a tensor the family does not use
  // is an error naming it (unless the family declared it harmless: warnings()). Matrices of a packable type
  // (kernels::PackedMatrix::packable) are repacked unless the environment sets
  // SERVAL_PACK_WEIGHTS=0 (for A/B benchmarks).
  // With tp.size > 1: only rank tp.rank's shard of the weights (model/tensor_parallel.h).
  static Expected<std::unique_ptr<Model>> load(const std::string& path, TensorParallel tp = {});
  static Expected<std::unique_ptr<Model>> from_file(gguf::GgufFile file, TensorParallel tp = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const gguf::GgufFile& file() const { return file_; }
  // Load-time warnings (known-harmless tensors that are not used), one line each.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  Model(gguf::GgufFile f) : file_(std::move(f)) {}
  Status load_weights();
  void pack_weights();

  gguf::GgufFile file_;
  ModelConfig config_;
  ModelWeights weights_;
  std::vector<std::string> warnings_;
};

}  // namespace serval
