// Generated Unicode property tables (unicode_tables.cpp, made by
// scripts/gen_unicode_tables.py). Private to src/tokenizer: use unicode.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tokenizer/unicode.h"

namespace serval::unicode_tables {

using unicode::Category;

struct CategoryRange {
  uint32_t first;     // the range runs up to the next entry's first - 1
  Category category;
};

struct CodepointPair {
  uint32_t from;
  uint32_t to;
};

struct NfdRange {
  uint32_t first;
  uint32_t last;
  uint32_t base;  // first code point of the NFD decomposition
};

extern const char* const kUnicodeVersion;
extern const CategoryRange kCategoryRanges[];
extern const size_t kCategoryRangesSize;
extern const CodepointPair kLowercase[];
extern const size_t kLowercaseSize;
extern const NfdRange kNfdRanges[];
extern const size_t kNfdRangesSize;

}  // namespace serval::unicode_tables
