// A read-only memory mapping of a whole file. Move-only; the mapping lives as
// long as the object. Thread-safe to read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace serval {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps `path` read-only. Errors: not_found, io_error (directory, mmap failure).
  static Expected<MappedFile> open(const std::string& path);

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Tells the kernel the whole pages inside [p, p + n) (a range of this
  // mapping) are not needed for now: they leave the process's resident set
  // (the page cache keeps them) and fault back in if read again. For data
  // the caller has copied elsewhere, e.g. repacked weights.
  void release(const void* p, size_t n) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace serval
