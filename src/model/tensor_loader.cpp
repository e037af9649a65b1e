#include "model/tensor_loader.h"

#include "kernels/ref/quants.h"

namespace serval {

std::string shape_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

Expected<const gguf::TensorInfo*> TensorLoader::get(const std::string& name, const std::vector<int64_t>& dims,
                                                    bool optional) {
  const gguf::TensorInfo* t = f_.find_tensor(name);
  if (!t) {
    if (optional) return static_cast<const gguf::TensorInfo*>(nullptr);
    return not_found("tensor '" + name + "' is missing");
  }
  // Trailing dims of 1 are equivalent ([n] == [n, 1]).
  std::vector<int64_t> have = t->dims;
  while (have.size() > dims.size() && have.back() == 1) have.pop_back();
  if (have != dims)
    return invalid_file("tensor '" + name + "': expected shape " + shape_str(dims) + ", got " + shape_str(t->dims));
  if (!ref::can_dequantize(t->type))
    return unsupported("tensor '" + name + "': type " + std::string(dtype_name(t->type)) + " is not supported");
  used_.insert(name);
  return t;
}

Status TensorLoader::matrix(const std::string& name, int64_t rows, int64_t cols, Matrix* out, bool optional) {
  auto t = get(name, {cols, rows}, optional);
  if (!t.ok()) return t.status();
  if (!*t) return {};
  out->type = (*t)->type;
  out->rows = rows;
  out->cols = cols;
  out->data = f_.tensor_data(**t).data();
  return {};
}

Status TensorLoader::vec(const std::string& name, int64_t n, std::vector<float>* out, bool optional) {
  auto t = get(name, {n}, optional);
  if (!t.ok()) return t.status();
  if (!*t) return {};
  out->resize((size_t)n);
  ref::dequantize_row((*t)->type, f_.tensor_data(**t).data(), out->data(), n);
  return {};
}

Status TensorLoader::matrices(const std::string& name, int64_t n, int64_t rows, int64_t cols, std::vector<Matrix>* out) {
  auto t = get(name, {cols, rows, n}, false);
  if (!t.ok()) return t.status();
  const uint8_t* base = f_.tensor_data(**t).data();
  const size_t slice = row_size((*t)->type, cols) * (size_t)rows;
  out->assign((size_t)n, Matrix{});
  for (int64_t e = 0; e < n; ++e) {
    Matrix& m = (*out)[(size_t)e];
    m.type = (*t)->type;
    m.rows = rows;
    m.cols = cols;
    m.data = base + (size_t)e * slice;
  }
  return {};
}

Status TensorLoader::vecs(const std::string& name, int64_t n, int64_t len, std::vector<float>* out) {
  auto t = get(name, {len, n}, false);
  if (!t.ok()) return t.status();
  out->resize((size_t)(n * len));
  const uint8_t* base = f_.tensor_data(**t).data();
  const size_t row = row_size((*t)->type, len);
  for (int64_t e = 0; e < n; ++e) ref::dequantize_row((*t)->type, base + (size_t)e * row, out->data() + e * len, len);
  return {};
}

void TensorLoader::ignore(const std::string& name, const std::string& why) {
  if (!f_.find_tensor(name) || used_.count(name)) return;
  used_.insert(name);
  warnings_.push_back("tensor '" + name + "' is not used: " + why);
}

std::vector<std::string> TensorLoader::unused() const {
  std::vector<std::string> out;
  for (const gguf::TensorInfo& t : f_.tensors())
    if (!used_.count(t.name)) out.push_back(t.name);
  return out;
}

}  // namespace serval
