#include "gguf/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "gguf/gguf_reader.h"

namespace serval::gguf {
namespace {

class Out {
 public:
  std::vector<uint8_t> buf;
  template <typename T>
  void put(T x) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    buf.insert(buf.end(), b, b + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    buf.insert(buf.end(), s.begin(), s.end());
  }
  void put_value(const Value& v) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            put_string(x);
          } else if constexpr (std::is_same_v<T, std::shared_ptr<const Array>>) {
            put<uint32_t>((uint32_t)x->elem_type);
            put<uint64_t>(x->items.size());
            for (const auto& item : x->items) put_value(item);
          } else if constexpr (std::is_same_v<T, bool>) {
            put<uint8_t>(x ? 1 : 0);
          } else {
            put<T>(x);
          }
        },
        v.v);
  }
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t spec_bytes(const std::vector<int64_t>& dims, uint32_t raw_type) {
  auto tr = dtype_traits(raw_type);
  if (!tr) return 0;
  uint64_t n = 1;
  for (auto d : dims) n *= (uint64_t)d;
  return n / tr->block_size * tr->type_size;
}

}  // namespace

void GgufWriter::add(std::string key, Value v) { kv_.push_back({std::move(key), std::move(v)}); }

void GgufWriter::set(std::string key, Value v) {
  for (auto& kv : kv_)
    if (kv.key == key) {
      kv.value = std::move(v);
      return;
    }
  add(std::move(key), std::move(v));
}

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> dims, DType type, std::vector<uint8_t> data) {
  TensorSpec t{std::move(name), std::move(dims), (uint32_t)type, 0, std::move(data), nullptr, std::nullopt};
  t.n_bytes = t.data.size();
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> dims, DType type, FillFn fill) {
  TensorSpec t{std::move(name), std::move(dims), (uint32_t)type, 0, {}, std::move(fill), std::nullopt};
  t.n_bytes = spec_bytes(t.dims, t.raw_type);
  tensors_.push_back(std::move(t));
}

void GgufWriter::override_last_offset(uint64_t offset) {
  if (!tensors_.empty()) tensors_.back().offset = offset;
}

void GgufWriter::override_last_type(uint32_t raw_type) {
  if (!tensors_.empty()) tensors_.back().raw_type = raw_type;
}

uint32_t GgufWriter::alignment() const {
  for (const auto& kv : kv_)
    if (kv.key == "general.alignment" && kv.value.type() == ValueType::u32) {
      uint32_t a = std::get<uint32_t>(kv.value.v);
      if (a != 0 && (a & (a - 1)) == 0) return a;
    }
  return kDefaultAlignment;
}

std::vector<uint8_t> GgufWriter::header_bytes(std::vector<uint64_t>* offsets, uint64_t* data_start) const {
  Out o;
  o.put<uint32_t>(kMagic);
  o.put<uint32_t>(overrides_.version.value_or(3));
  o.put<uint64_t>(overrides_.n_tensors.value_or(tensors_.size()));
  o.put<uint64_t>(overrides_.n_kv.value_or(kv_.size()));
  for (const auto& kv : kv_) {
    o.put_string(kv.key);
    o.put<uint32_t>((uint32_t)kv.value.type());
    o.put_value(kv.value);
  }
  const uint64_t al = alignment();
  uint64_t off = 0;
  offsets->clear();
  for (const auto& t : tensors_) {
    o.put_string(t.name);
    o.put<uint32_t>((uint32_t)t.dims.size());
    for (auto d : t.dims) o.put<uint64_t>((uint64_t)d);
    o.put<uint32_t>(t.raw_type);
    const uint64_t this_off = t.offset.value_or(off);
    o.put<uint64_t>(this_off);
    offsets->push_back(this_off);
    off = align_up(this_off + t.n_bytes, al);
  }
  *data_start = align_up(o.buf.size(), al);
  o.buf.resize(*data_start, 0);
  return std::move(o.buf);
}

Expected<std::vector<uint8_t>> GgufWriter::serialize() const {
  std::vector<uint64_t> offsets;
  uint64_t data_start = 0;
  std::vector<uint8_t> out = header_bytes(&offsets, &data_start);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    const uint64_t at = data_start + offsets[i];
    if (out.size() < at + t.n_bytes) out.resize(at + t.n_bytes, 0);
    if (t.fill) t.fill(out.data() + at, t.n_bytes);
    else if (!t.data.empty()) std::memcpy(out.data() + at, t.data.data(), t.data.size());
  }
  out.resize(align_up(out.size(), alignment()), 0);
  return out;
}

Status GgufWriter::write_file(const std::string& path) const {
  std::vector<uint64_t> offsets;
  uint64_t data_start = 0;
  const std::vector<uint8_t> header = header_bytes(&offsets, &data_start);
  const std::string tmp = path + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (!f) return io_error("cannot create '" + tmp + "': " + std::strerror(errno));
  auto write = [&](const void* p, size_t n) { return std::fwrite(p, 1, n, f.get()) == n; };
  bool ok = write(header.data(), header.size());
  uint64_t pos = data_start;
  std::vector<uint8_t> buf;
  for (size_t i = 0; ok && i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    const uint64_t at = data_start + offsets[i];
    if (at < pos) return invalid_argument("tensor '" + t.name + "': overlapping offsets cannot be streamed");
    std::vector<uint8_t> pad(at - pos, 0);
    ok = write(pad.data(), pad.size());
    if (t.fill) {
      buf.assign(t.n_bytes, 0);
      t.fill(buf.data(), t.n_bytes);
      ok = ok && write(buf.data(), buf.size());
    } else {
      ok = ok && write(t.data.data(), t.data.size());
    }
    pos = at + t.n_bytes;
  }
  const uint64_t end = align_up(pos, alignment());
  std::vector<uint8_t> pad(end - pos, 0);
  ok = ok && write(pad.data(), pad.size());
  ok = (std::fflush(f.get()) == 0) && ok;
  f.reset();
  if (!ok) {
    std::remove(tmp.c_str());
    return io_error("cannot write '" + tmp + "': " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return io_error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  return {};
}

}  // namespace serval::gguf
