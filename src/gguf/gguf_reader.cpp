#include "gguf/gguf_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace serval::gguf {
namespace {

// Structural bounds that no real model approaches; they keep a hostile file from
// making the reader spend unbounded time or memory on empty structure.
constexpr uint64_t kMaxKeyLength = 1 << 16;
constexpr uint64_t kMaxStringLength = 1ull << 30;  // still also bounded by the file size
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxAlignment = 1u << 20;

bool mul_overflow(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool add_overflow(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

// Bounds-checked little-endian cursor over the file image.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  bool read(T* out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  // Reads a GGUF string (u64 length + bytes). Fails on truncation or length > max_len.
  Status read_string(std::string* out, uint64_t max_len, const std::string& what) {
    uint64_t len = 0;
    if (!read(&len)) return invalid_file(what + ": truncated file (string length past end of file)");
    if (len > max_len)
      return invalid_file(what + ": string length " + std::to_string(len) + " exceeds the limit of " +
                          std::to_string(max_len));
    if (len > remaining())
      return invalid_file(what + ": string length " + std::to_string(len) + " runs past the end of the file (" +
                          std::to_string(remaining()) + " bytes left)");
    out->assign(reinterpret_cast<const char*>(data_ + pos_), (size_t)len);
    pos_ += (size_t)len;
    return {};
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Smallest encoded size of one value of a type (used to bound array lengths by
// the bytes actually present before allocating).
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::u8: case ValueType::i8: case ValueType::boolean: return 1;
    case ValueType::u16: case ValueType::i16: return 2;
    case ValueType::u32: case ValueType::i32: case ValueType::f32: return 4;
    case ValueType::u64: case ValueType::i64: case ValueType::f64: return 8;
    case ValueType::string: return 8;
    case ValueType::array: return 12;
  }
  return 1;
}

Status read_value(Cursor& c, ValueType type, Value* out, int depth, const std::string& what);

template <typename T>
Status read_scalar(Cursor& c, Value* out, const std::string& what) {
  T x{};
  if (!c.read(&x)) return invalid_file(what + ": truncated file (value past end of file)");
  out->v = x;
  return {};
}

Status read_array(Cursor& c, Value* out, int depth, const std::string& what) {
  if (depth >= kMaxArrayDepth)
    return invalid_file(what + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
  uint32_t raw_type = 0;
  uint64_t n = 0;
  if (!c.read(&raw_type) || !c.read(&n)) return invalid_file(what + ": truncated file (array header)");
  if (raw_type >= kValueTypeCount)
    return invalid_file(what + ": invalid array element type " + std::to_string(raw_type));
  const auto et = (ValueType)raw_type;
  uint64_t need = 0;
  if (mul_overflow(n, min_encoded_size(et), &need) || need > c.remaining())
    return invalid_file(what + ": array of " + std::to_string(n) + " " + std::string(value_type_name(et)) +
                        " elements runs past the end of the file (" + std::to_string(c.remaining()) +
                        " bytes left)");
  Array arr;
  arr.elem_type = et;
  arr.items.resize((size_t)n);
  for (uint64_t i = 0; i < n; ++i) {
    SERVAL_RETURN_IF_ERROR(read_value(c, et, &arr.items[(size_t)i], depth + 1, what));
  }
  *out = Value(std::move(arr));
  return {};
}

Status read_value(Cursor& c, ValueType type, Value* out, int depth, const std::string& what) {
  switch (type) {
    case ValueType::u8: return read_scalar<uint8_t>(c, out, what);
    case ValueType::i8: return read_scalar<int8_t>(c, out, what);
    case ValueType::u16: return read_scalar<uint16_t>(c, out, what);
    case ValueType::i16: return read_scalar<int16_t>(c, out, what);
    case ValueType::u32: return read_scalar<uint32_t>(c, out, what);
    case ValueType::i32: return read_scalar<int32_t>(c, out, what);
    case ValueType::f32: return read_scalar<float>(c, out, what);
    case ValueType::u64: return read_scalar<uint64_t>(c, out, what);
    case ValueType::i64: return read_scalar<int64_t>(c, out, what);
    case ValueType::f64: return read_scalar<double>(c, out, what);
    case ValueType::boolean: {
      uint8_t b = 0;
      if (!c.read(&b)) return invalid_file(what + ": truncated file (value past end of file)");
      if (b > 1) return invalid_file(what + ": bool value must be 0 or 1, got " + std::to_string(b));
      out->v = (b != 0);
      return {};
    }
    case ValueType::string: {
      std::string s;
      SERVAL_RETURN_IF_ERROR(c.read_string(&s, kMaxStringLength, what));
      out->v = std::move(s);
      return {};
    }
    case ValueType::array: return read_array(c, out, depth, what);
  }
  return invalid_file(what + ": invalid value type " + std::to_string((uint32_t)type));
}

std::string dims_to_string(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

Expected<GgufFile> GgufFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  if (!mf.ok()) return mf.status();
  GgufFile f;
  f.file_ = std::move(mf.value());
  f.data_ = f.file_.data();
  f.size_ = f.file_.size();
  Status st = f.parse_header();
  if (!st.ok()) return st.with_context("'" + path + "'");
  return f;
}

Expected<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufFile f;
  f.owned_.assign(bytes.begin(), bytes.end());
  f.data_ = f.owned_.data();
  f.size_ = f.owned_.size();
  Status st = f.parse_header();
  if (!st.ok()) return st;
  return f;
}

Status GgufFile::parse_header() {
  Cursor c(data_, size_);
  uint32_t magic = 0;
  if (!c.read(&magic)) return invalid_file("not a GGUF file: " + std::to_string(size_) + " bytes is too short");
  if (magic != kMagic) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "not a GGUF file: bad magic 0x%08x (expected 0x%08x \"GGUF\")", magic, kMagic);
    return invalid_file(buf);
  }
  if (!c.read(&version_)) return invalid_file("truncated file: no version");
  if (version_ != 2 && version_ != 3)
    return unsupported("unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  uint64_t n_tensors = 0, n_kv = 0;
  if (!c.read(&n_tensors) || !c.read(&n_kv)) return invalid_file("truncated file: header counts");
  // Each key-value needs at least 8 (key length) + 4 (type) + 1 bytes; each
  // tensor info at least 8 + 4 + 8 + 4 + 8. Counts that cannot fit are lies.
  if (n_kv > c.remaining() / 13)
    return invalid_file("n_kv = " + std::to_string(n_kv) + " cannot fit in the " + std::to_string(c.remaining()) +
                        " bytes left in the file");
  if (n_tensors > c.remaining() / 32)
    return invalid_file("n_tensors = " + std::to_string(n_tensors) + " cannot fit in the " +
                        std::to_string(c.remaining()) + " bytes left in the file");

  kv_.reserve((size_t)n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    KeyValue kv;
    SERVAL_RETURN_IF_ERROR(c.read_string(&kv.key, kMaxKeyLength, "metadata key #" + std::to_string(i)));
    const std::string what = "metadata key '" + kv.key + "'";
    uint32_t raw_type = 0;
    if (!c.read(&raw_type)) return invalid_file(what + ": truncated file (value type)");
    if (raw_type >= kValueTypeCount) return invalid_file(what + ": invalid value type " + std::to_string(raw_type));
    SERVAL_RETURN_IF_ERROR(read_value(c, (ValueType)raw_type, &kv.value, 0, what));
    if (kv_index_.count(kv.key)) return invalid_file("duplicate metadata key '" + kv.key + "'");
    kv_index_.emplace(kv.key, kv_.size());
    kv_.push_back(std::move(kv));
  }

  if (const Value* a = find("general.alignment")) {
    if (a->type() != ValueType::u32)
      return invalid_file("metadata key 'general.alignment': expected u32, got " +
                          std::string(value_type_name(a->type())));
    const uint32_t al = std::get<uint32_t>(a->v);
    if (al == 0 || (al & (al - 1)) != 0 || al > kMaxAlignment)
      return invalid_file("metadata key 'general.alignment': expected a power of two in [1, " +
                          std::to_string(kMaxAlignment) + "], got " + std::to_string(al));
    alignment_ = al;
  }

  tensors_.reserve((size_t)n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    SERVAL_RETURN_IF_ERROR(c.read_string(&t.name, kMaxKeyLength, "tensor #" + std::to_string(i) + " name"));
    const std::string what = "tensor '" + t.name + "'";
    uint32_t n_dims = 0;
    if (!c.read(&n_dims)) return invalid_file(what + ": truncated file (n_dims)");
    if (n_dims == 0 || n_dims > kMaxDims)
      return invalid_file(what + ": n_dims = " + std::to_string(n_dims) + ", expected 1.." + std::to_string(kMaxDims));
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (!c.read(&dim)) return invalid_file(what + ": truncated file (dims)");
      if (dim == 0 || dim > (uint64_t)std::numeric_limits<int64_t>::max())
        return invalid_file(what + ": dimension " + std::to_string(d) + " = " + std::to_string(dim) +
                            " is out of range");
      if (mul_overflow(n_el, dim, &n_el) || n_el > (uint64_t)std::numeric_limits<int64_t>::max())
        return invalid_file(what + ": element count overflows (dims " + dims_to_string(t.dims) + " x " +
                            std::to_string(dim) + ")");
      t.dims.push_back((int64_t)dim);
    }
    uint32_t raw_type = 0;
    if (!c.read(&raw_type) || !c.read(&t.offset)) return invalid_file(what + ": truncated file (type/offset)");
    auto tr = dtype_traits(raw_type);
    if (!tr) {
      const std::string foreign = foreign_type_name(raw_type);
      if (!foreign.empty())
        return invalid_file(what + ": tensor type " + std::to_string(raw_type) + " is " + foreign +
                            ", which serval does not read (quantize the model with llama.cpp's llama-quantize, or "
                            "with serval quantize from F16/BF16)");
      return invalid_file(what + ": invalid tensor type " + std::to_string(raw_type));
    }
    t.type = (DType)raw_type;
    if (t.dims[0] % tr->block_size != 0)
      return invalid_file(what + ": row length " + std::to_string(t.dims[0]) + " is not a multiple of the " +
                          std::string(tr->name) + " block size " + std::to_string(tr->block_size));
    t.n_elements = n_el;
    if (mul_overflow(n_el / tr->block_size, tr->type_size, &t.n_bytes))
      return invalid_file(what + ": byte size overflows");
    if (t.offset % alignment_ != 0)
      return invalid_file(what + ": data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                          std::to_string(alignment_));
    if (tensor_index_.count(t.name)) return invalid_file("duplicate tensor name '" + t.name + "'");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  uint64_t pos = c.pos();
  uint64_t data_off = (pos + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_off > size_)
    return invalid_file("truncated file: data section would start at " + std::to_string(data_off) +
                        " but the file has " + std::to_string(size_) + " bytes");
  data_offset_ = data_off;
  const uint64_t data_size = size_ >= data_off ? size_ - data_off : 0;

  // Every tensor lies inside the file, and no two overlap.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (const auto& t : tensors_) {
    uint64_t end = 0;
    if (add_overflow(t.offset, t.n_bytes, &end) || end > data_size)
      return invalid_file("tensor '" + t.name + "': data [" + std::to_string(t.offset) + ", +" +
                          std::to_string(t.n_bytes) + ") runs past the end of the file (data section is " +
                          std::to_string(data_size) + " bytes)");
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = tensors_[order[i - 1]];
    const auto& cur = tensors_[order[i]];
    if (prev.offset + prev.n_bytes > cur.offset)
      return invalid_file("tensor '" + cur.name + "' (offset " + std::to_string(cur.offset) + ") overlaps tensor '" +
                          prev.name + "' (offset " + std::to_string(prev.offset) + ", " +
                          std::to_string(prev.n_bytes) + " bytes)");
  }
  return {};
}

const Value* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

namespace {

Status type_error(std::string_view key, std::string_view expected, const Value& v) {
  return invalid_file("metadata key '" + std::string(key) + "': expected " + std::string(expected) + ", got " +
                      std::string(value_type_name(v.type())));
}

// Integer value of any integer alternative; false for non-integers.
bool as_int128(const Value& v, __int128* out) {
  return std::visit(
      [&](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          *out = (__int128)x;
          return true;
        } else {
          return false;
        }
      },
      v.v);
}

}  // namespace

Expected<std::string> GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return not_found("metadata key '" + std::string(key) + "' is missing");
  if (v->type() != ValueType::string) return type_error(key, "string", *v);
  return std::get<std::string>(v->v);
}

Expected<uint64_t> GgufFile::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return not_found("metadata key '" + std::string(key) + "' is missing");
  __int128 x = 0;
  if (!as_int128(*v, &x)) return type_error(key, "an unsigned integer", *v);
  if (x < 0)
    return invalid_file("metadata key '" + std::string(key) + "': expected a value >= 0, got " +
                        std::to_string((int64_t)x));
  return (uint64_t)x;
}

Expected<int64_t> GgufFile::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return not_found("metadata key '" + std::string(key) + "' is missing");
  __int128 x = 0;
  if (!as_int128(*v, &x)) return type_error(key, "an integer", *v);
  if (x > (__int128)std::numeric_limits<int64_t>::max())
    return invalid_file("metadata key '" + std::string(key) + "': value does not fit in int64");
  return (int64_t)x;
}

Expected<double> GgufFile::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return not_found("metadata key '" + std::string(key) + "' is missing");
  if (v->type() == ValueType::f32) return (double)std::get<float>(v->v);
  if (v->type() == ValueType::f64) return std::get<double>(v->v);
  __int128 x = 0;
  if (as_int128(*v, &x)) return (double)x;
  return type_error(key, "a float", *v);
}

Expected<bool> GgufFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return not_found("metadata key '" + std::string(key) + "' is missing");
  if (v->type() != ValueType::boolean) return type_error(key, "bool", *v);
  return std::get<bool>(v->v);
}

Expected<const Array*> GgufFile::get_array(std::string_view key, ValueType elem) const {
  const Value* v = find(key);
  if (!v) return not_found("metadata key '" + std::string(key) + "' is missing");
  if (v->type() != ValueType::array) return type_error(key, "an array", *v);
  const Array* a = std::get<std::shared_ptr<const Array>>(v->v).get();
  if (elem != ValueType::array && a->elem_type != elem)
    return invalid_file("metadata key '" + std::string(key) + "': expected an array of " +
                        std::string(value_type_name(elem)) + ", got an array of " +
                        std::string(value_type_name(a->elem_type)));
  return a;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::tensor_data(const TensorInfo& t) const {
  return {data_ + data_offset_ + t.offset, (size_t)t.n_bytes};
}

}  // namespace serval::gguf
