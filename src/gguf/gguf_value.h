// GGUF metadata values: the 13 value types of the format, arrays (nested too)
// as typed vectors. Value types; thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace serval::gguf {

enum class ValueType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
constexpr uint32_t kValueTypeCount = 13;

std::string_view value_type_name(ValueType t);

struct Array;

// One metadata value. Arrays are held by pointer so Value stays small.
struct Value {
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, std::shared_ptr<const Array>, uint64_t, int64_t, double>;
  Storage v;

  ValueType type() const;

  Value() : v(uint8_t{0}) {}
  template <typename T>
  Value(T x) : v(std::move(x)) {}  // NOLINT(implicit)
  Value(const char* s) : v(std::string(s)) {}
  Value(Array a);
};

struct Array {
  ValueType elem_type = ValueType::u8;
  std::vector<Value> items;  // every item has type elem_type
};

inline Value::Value(Array a) : v(std::make_shared<const Array>(std::move(a))) {}

struct KeyValue {
  std::string key;
  Value value;
};

// Value as text for `serval gguf info` (arrays shortened after `max_items`).
std::string value_to_string(const Value& v, size_t max_items = 8);

}  // namespace serval::gguf
