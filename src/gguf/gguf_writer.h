// GGUF writer (version 3 by default). Builds the header from metadata and
// tensor specs, lays tensor data out at `general.alignment` (default 32) and
// writes the file. Tensor data is produced one tensor at a time (a fill
// callback), so writing a multi-GB model needs memory for one tensor only.
//
// For tests the writer can also produce deliberately malformed files:
// duplicate keys are kept in order, and `Overrides` forces header counts and
// tensor offsets. Not thread-safe; one writer per file.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_value.h"
#include "tensor/dtype.h"

namespace serval::gguf {

class GgufWriter {
 public:
  // Fills exactly n_bytes at dst (the tensor's row_size * rows).
  using FillFn = std::function<void(uint8_t* dst, uint64_t n_bytes)>;

  struct Overrides {
    std::optional<uint32_t> version;
    std::optional<uint64_t> n_tensors;  // header count, regardless of the tensors added
    std::optional<uint64_t> n_kv;       // header count, regardless of the keys added
  };

  // Appends a key (a duplicate key is kept: tests use it to craft bad files).
  void add(std::string key, Value v);
  // Replaces the first key of that name, or appends it.
  void set(std::string key, Value v);

  // Adds a tensor whose bytes are given (must be the exact size for dims/type).
  void add_tensor(std::string name, std::vector<int64_t> dims, DType type, std::vector<uint8_t> data);
  // Adds a tensor whose bytes are produced by `fill` while writing.
  void add_tensor(std::string name, std::vector<int64_t> dims, DType type, FillFn fill);
  // Forces the data offset (relative to the data section) of the last tensor added.
  void override_last_offset(uint64_t offset);
  // Forces the raw type id of the last tensor added (any uint32, even invalid ones).
  void override_last_type(uint32_t raw_type);

  Overrides& overrides() { return overrides_; }

  // The whole file image in memory (small files, tests).
  Expected<std::vector<uint8_t>> serialize() const;
  // Writes to `path` (via a temporary file renamed into place).
  Status write_file(const std::string& path) const;

 private:
  struct TensorSpec {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t raw_type;
    uint64_t n_bytes;
    std::vector<uint8_t> data;
    FillFn fill;
    std::optional<uint64_t> offset;
  };

  uint32_t alignment() const;
  std::vector<uint8_t> header_bytes(std::vector<uint64_t>* offsets, uint64_t* data_start) const;

  std::vector<KeyValue> kv_;
  std::vector<TensorSpec> tensors_;
  Overrides overrides_;
};

}  // namespace serval::gguf
