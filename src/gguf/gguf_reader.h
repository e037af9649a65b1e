// GGUF reader (versions 2 and 3) over a memory-mapped file.
//
// open() validates the whole header before returning: every count, length,
// dimension product and offset is checked with overflow-safe arithmetic against
// the file size; allocations are bounded by the bytes actually present. A bad
// file gives an invalid_file Status naming what is wrong, never a crash.
//
// After open() the object is immutable and safe to read from any thread.
// Tensor data pointers point into the mapping and live as long as the GgufFile.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "gguf/gguf_value.h"
#include "tensor/dtype.h"

namespace serval::gguf {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne[0] is the innermost (contiguous) dimension
  DType type = DType::f32;
  uint64_t offset = 0;        // relative to the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
};

class GgufFile {
 public:
  // Maps and validates `path`.
  static Expected<GgufFile> open(const std::string& path);
  // Validates an in-memory image (tests, fuzzing). The bytes are copied.
  static Expected<GgufFile> parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  size_t file_size() const { return size_; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Type-checked getters. Errors: not_found (missing key) or invalid_file
  // ("key 'k': expected <type>, got <type>" / value out of range).
  Expected<std::string> get_string(std::string_view key) const;
  Expected<uint64_t> get_uint(std::string_view key) const;  // any integer type, value >= 0
  Expected<int64_t> get_int(std::string_view key) const;    // any integer type
  Expected<double> get_float(std::string_view key) const;   // f32 or f64 (or an integer)
  Expected<bool> get_bool(std::string_view key) const;
  // An array whose elements have type `elem` (pass ValueType::array for any).
  Expected<const Array*> get_array(std::string_view key, ValueType elem) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Bytes of a tensor's data (validated to lie inside the file).
  std::span<const uint8_t> tensor_data(const TensorInfo& t) const;
  // MappedFile::release for bytes of a mapped file (no-op for parsed buffers).
  void release(const void* p, size_t n) const { file_.release(p, n); }

 private:
  Status parse_header();

  MappedFile file_;
  std::vector<uint8_t> owned_;  // for parse()
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;

  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace serval::gguf
