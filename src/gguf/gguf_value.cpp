#include "gguf/gguf_value.h"

#include <cstdio>

namespace serval::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::u8: return "u8";
    case ValueType::i8: return "i8";
    case ValueType::u16: return "u16";
    case ValueType::i16: return "i16";
    case ValueType::u32: return "u32";
    case ValueType::i32: return "i32";
    case ValueType::f32: return "f32";
    case ValueType::boolean: return "bool";
    case ValueType::string: return "string";
    case ValueType::array: return "array";
    case ValueType::u64: return "u64";
    case ValueType::i64: return "i64";
    case ValueType::f64: return "f64";
  }
  return "invalid";
}

ValueType Value::type() const {
  // The variant's alternatives are declared in ValueType order.
  return static_cast<ValueType>(v.index());
}

std::string value_to_string(const Value& val, size_t max_items) {
  struct Visitor {
    size_t max_items;
    std::string operator()(uint8_t x) const { return std::to_string(x); }
    std::string operator()(int8_t x) const { return std::to_string(x); }
    std::string operator()(uint16_t x) const { return std::to_string(x); }
    std::string operator()(int16_t x) const { return std::to_string(x); }
    std::string operator()(uint32_t x) const { return std::to_string(x); }
    std::string operator()(int32_t x) const { return std::to_string(x); }
    std::string operator()(uint64_t x) const { return std::to_string(x); }
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(float x) const { return fmt((double)x); }
    std::string operator()(double x) const { return fmt(x); }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& s) const {
      std::string out = "\"";
      for (size_t i = 0; i < s.size() && i < 120; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { out += '\\'; out += (char)c; }
        else if (c == '\n') out += "\\n";
        else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\x%02x", c); out += b; }
        else out += (char)c;
      }
      if (s.size() > 120) out += "...";
      return out + "\"";
    }
    std::string operator()(const std::shared_ptr<const Array>& a) const {
      std::string out = "[" + std::string(value_type_name(a->elem_type)) + " x " + std::to_string(a->items.size()) + "] [";
      for (size_t i = 0; i < a->items.size() && i < max_items; ++i) {
        if (i) out += ", ";
        out += value_to_string(a->items[i], max_items);
      }
      if (a->items.size() > max_items) out += ", ...";
      return out + "]";
    }
    static std::string fmt(double x) {
      char b[32];
      std::snprintf(b, sizeof b, "%.6g", x);
      return b;
    }
  };
  return std::visit(Visitor{max_items}, val.v);
}

}  // namespace serval::gguf
