#include "quantize/imatrix.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "common/mapped_file.h"

namespace serval::quant {
namespace {

constexpr int32_t kMaxNameLen = 4096;

// Bounds-checked little-endian reader over a byte span.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> b) : b_(b) {}
  size_t left() const { return b_.size() - at_; }
  bool i32(int32_t* v) { return raw(v, 4); }
  bool raw(void* dst, size_t n) {
    if (n > left()) return false;
    std::memcpy(dst, b_.data() + at_, n);
    at_ += n;
    return true;
  }

 private:
  std::span<const uint8_t> b_;
  size_t at_ = 0;
};

}  // namespace

std::vector<float> Imatrix::weights(const std::string& name) const {
  auto it = entries.find(name);
  if (it == entries.end()) return {};
  std::vector<float> w = it->second.values;
  if (it->second.ncall > 0)
    for (float& v : w) v /= (float)it->second.ncall;
  return w;
}

Expected<Imatrix> read_imatrix(const std::string& path) {
  auto f = MappedFile::open(path);
  if (!f.ok()) return f.status();
  const std::string ctx = "imatrix '" + path + "'";
  if (f->size() >= 4 && std::memcmp(f->data(), "GGUF", 4) == 0)
    return invalid_file(ctx + ": GGUF imatrix files are not supported; write the legacy format "
                              "(llama-imatrix --output-format dat, or serval imatrix)");
  Cursor c(f->bytes());
  int32_t n = 0;
  if (!c.i32(&n) || n <= 0 || (size_t)n > c.left() / 12)
    return invalid_file(ctx + ": bad entry count " + std::to_string(n));
  Imatrix im;
  for (int32_t e = 0; e < n; ++e) {
    const std::string at = ctx + ": entry " + std::to_string(e);
    int32_t len = 0;
    if (!c.i32(&len) || len <= 0 || len > kMaxNameLen || (size_t)len > c.left())
      return invalid_file(at + ": bad name length " + std::to_string(len));
    std::string name((size_t)len, '\0');
    c.raw(name.data(), (size_t)len);
    ImatrixEntry ent;
    int32_t nval = 0;
    if (!c.i32(&ent.ncall) || !c.i32(&nval) || ent.ncall < 0 || nval <= 0 || (size_t)nval > c.left() / 4)
      return invalid_file(at + " ('" + name + "'): bad ncall/nval " + std::to_string(ent.ncall) + "/" +
                          std::to_string(nval));
    ent.values.resize((size_t)nval);
    c.raw(ent.values.data(), (size_t)nval * 4);
    for (float v : ent.values)
      if (!std::isfinite(v) || v < 0)
        return invalid_file(at + " ('" + name + "'): value " + std::to_string(v) + " is not finite and >= 0");
    if (!im.entries.emplace(name, std::move(ent)).second) return invalid_file(at + ": duplicate name '" + name + "'");
  }
  // Optional trailer: last call and the dataset name.
  if (c.left() >= 4) {
    c.i32(&im.last_call);
    int32_t len = 0;
    if (c.i32(&len) && len > 0 && len <= kMaxNameLen && (size_t)len <= c.left()) {
      im.dataset.resize((size_t)len);
      c.raw(im.dataset.data(), (size_t)len);
    }
  }
  return im;
}

Status write_imatrix(const Imatrix& im, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return io_error("cannot write '" + tmp + "'");
    auto i32 = [&](int32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
    i32((int32_t)im.entries.size());
    for (const auto& [name, e] : im.entries) {
      i32((int32_t)name.size());
      out.write(name.data(), (std::streamsize)name.size());
      i32(e.ncall);
      i32((int32_t)e.values.size());
      out.write(reinterpret_cast<const char*>(e.values.data()), (std::streamsize)(e.values.size() * 4));
    }
    i32(im.last_call);
    i32((int32_t)im.dataset.size());
    out.write(im.dataset.data(), (std::streamsize)im.dataset.size());
    if (!out.flush()) return io_error("writing '" + tmp + "' failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return io_error("cannot rename '" + tmp + "' to '" + path + "'");
  return {};
}

ImatrixCollector::ImatrixCollector(const Model& model) {
  auto add = [&](const Matrix& m, const std::string& name) {
    index_[&m] = acc_.size();
    acc_.push_back({name, std::vector<double>((size_t)m.cols, 0.0)});
  };
  const ModelWeights& w = model.weights();
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    add(l.wq, p + "attn_q.weight");
    add(l.wk, p + "attn_k.weight");
    add(l.wv, p + "attn_v.weight");
    add(l.wo, p + "attn_output.weight");
    add(l.w_gate, p + "ffn_gate.weight");
    add(l.w_up, p + "ffn_up.weight");
    add(l.w_down, p + "ffn_down.weight");
  }
  observer_ = [this](const Matrix& m, const float* in, int64_t rows) { observe(m, in, rows); };
}

void ImatrixCollector::observe(const Matrix& m, const float* in, int64_t rows) {
  auto it = index_.find(&m);
  if (it == index_.end()) return;  // output.weight
  std::vector<double>& s = acc_[it->second].sums;
  const int64_t n = (int64_t)s.size();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) s[(size_t)j] += (double)in[r * n + j] * in[r * n + j];
}

Imatrix ImatrixCollector::result(const std::string& dataset) const {
  Imatrix im;
  im.last_call = n_chunks_;
  im.dataset = dataset;
  for (const Acc& a : acc_) {
    ImatrixEntry e;
    e.ncall = n_chunks_;
    e.values.assign(a.sums.begin(), a.sums.end());
    im.entries[a.name] = std::move(e);
  }
  return im;
}

}  // namespace serval::quant
