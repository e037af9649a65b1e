#include "quantize/quantize_model.h"

#include <cstring>
#include <memory>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "kernels/ref/quants.h"

namespace serval::quant {

Expected<QuantizeSummary> quantize_model(const std::string& in_path, const std::string& out_path,
                                         const QuantizeOptions& opt) {
  auto opened = gguf::GgufFile::open(in_path);
  if (!opened.ok()) return opened.status();
  // Shared so the fill callbacks (run inside write_file) can hold it.
  auto src = std::make_shared<const gguf::GgufFile>(std::move(opened.value()));
  const Imatrix* im = opt.imatrix;
  const std::vector<TensorPlan> plans = plan_tensors(*src, opt.file_type, im != nullptr);
  auto warn = [&](const std::string& m) {
    if (opt.warn) opt.warn(m);
  };

  QuantizeSummary sum;
  size_t n_requant = 0;
  // Validate everything before writing a byte.
  std::vector<std::vector<float>> weights(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    const gguf::TensorInfo& t = src->tensors()[i];
    const TensorPlan& p = plans[i];
    sum.in_bytes += t.n_bytes;
    sum.n_fallback += p.fallback;
    if (!p.quantize) {
      ++sum.n_copied;
      continue;
    }
    if (!ref::can_dequantize(t.type))
      return unsupported("tensor '" + t.name + "': source type " + std::string(dtype_name(t.type)) +
                         " cannot be read");
    if (!is_float_type(t.type)) {
      if (!opt.allow_requantize)
        return invalid_argument("tensor '" + t.name + "' is already quantized (" + std::string(dtype_name(t.type)) +
                                "); quantize from the F32/F16/BF16 original, or pass --allow-requantize");
      ++n_requant;
    }
    ++sum.n_quantized;
    if (im) {
      weights[i] = im->weights(t.name);
      if (!weights[i].empty() && (int64_t)weights[i].size() != t.dims[0])
        return invalid_argument("imatrix entry '" + t.name + "' has " + std::to_string(weights[i].size()) +
                                " values, the tensor's rows have " + std::to_string(t.dims[0]));
      sum.n_imatrix += !weights[i].empty();
    }
    // As llama-quantize: the 1- and 2-bit lattice types without an importance
    // matrix lose most of the model, so they are refused.
    if (weights[i].empty() && needs_imatrix(opt.file_type, t.name, p.type)) {
      const std::string type(dtype_name(p.type));
      if (!im)
        return invalid_argument(std::string(opt.file_type.name) + " needs an importance matrix (tensor '" + t.name +
                                "' becomes " + type + "): make one with `serval imatrix` and pass --imatrix FILE");
      return invalid_argument("the imatrix has no entry for tensor '" + t.name + "', which becomes " + type +
                              " and needs one (an imatrix of another model?)");
    }
  }
  if (im && sum.n_imatrix == 0)
    return invalid_argument("the imatrix has no entry for any tensor of this model (wrong model?)");
  if (n_requant) warn("requantizing " + std::to_string(n_requant) + " already-quantized tensors: errors compound");

  gguf::GgufWriter w;
  for (const auto& kv : src->metadata()) w.add(kv.key, kv.value);
  w.set("general.file_type", opt.file_type.ftype);
  w.set("general.quantization_version", uint32_t{2});
  if (im) {
    w.set("quantize.imatrix.file", opt.imatrix_path);
    w.set("quantize.imatrix.dataset", im->dataset);
    w.set("quantize.imatrix.entries_count", (int32_t)im->entries.size());
    w.set("quantize.imatrix.chunks_count", im->last_call);
  }

  uint64_t out_total = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const gguf::TensorInfo& t = src->tensors()[i];
    out_total += plans[i].quantize ? row_size(plans[i].type, t.dims[0]) * (t.n_elements / (uint64_t)t.dims[0])
                                   : t.n_bytes;
  }
  sum.out_bytes = out_total;

  auto done = std::make_shared<std::pair<size_t, uint64_t>>(0, 0);
  const size_t n_tensors = plans.size();
  for (size_t i = 0; i < plans.size(); ++i) {
    const gguf::TensorInfo& t = src->tensors()[i];
    const TensorPlan p = plans[i];
    auto report = [&opt, done, n_tensors, out_total](uint64_t bytes) {
      done->first += 1;
      done->second += bytes;
      if (opt.progress) opt.progress(done->first, n_tensors, done->second, out_total);
    };
    if (!p.quantize) {
      w.add_tensor(t.name, t.dims, t.type, [src, &t, report](uint8_t* dst, uint64_t n) {
        std::memcpy(dst, src->tensor_data(t).data(), n);
        report(n);
      });
      continue;
    }
    const int64_t cols = t.dims[0];
    const int64_t rows = (int64_t)(t.n_elements / (uint64_t)cols);
    const float* imw = weights[i].empty() ? nullptr : weights[i].data();
    ThreadPool* pool = opt.pool;
    w.add_tensor(t.name, t.dims, p.type, [src, &t, p, cols, rows, imw, pool, report](uint8_t* dst, uint64_t n) {
      const uint8_t* in = src->tensor_data(t).data();
      const size_t in_rs = row_size(t.type, cols), out_rs = row_size(p.type, cols);
      auto work = [&](int64_t b, int64_t e) {
        std::vector<float> buf((size_t)cols);
        for (int64_t r = b; r < e; ++r) {
          ref::dequantize_row(t.type, in + (size_t)r * in_rs, buf.data(), cols);
          ref::quantize_row(p.type, buf.data(), dst + (size_t)r * out_rs, cols, imw);
        }
      };
      if (pool) pool->parallel_for(rows, work, 4);
      else work(0, rows);
      // The source pages are not needed again.
      src->release(in, t.n_bytes);
      report(n);
    });
  }
  SERVAL_RETURN_IF_ERROR(w.write_file(out_path));
  return sum;
}

}  // namespace serval::quant
