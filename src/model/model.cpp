#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "model/family.h"
#include "model/tensor_loader.h"
#include "model/tensor_parallel.h"

namespace serval {
Expected<std::unique_ptr<Model>> Model::load(const std::string& path, TensorParallel tp) {
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) return f.status();
  return from_file(std::move(f.value()), tp);
}

Expected<std::unique_ptr<Model>> Model::from_file(gguf::GgufFile file, TensorParallel tp) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  auto cfg = read_model_config(m->file_);
  if (!cfg.ok()) return cfg.status();
  m->config_ = *cfg;
  SERVAL_RETURN_IF_ERROR(m->load_weights());
  if (tp.size != 1) SERVAL_RETURN_IF_ERROR(shard_model(m->config_, m->weights_, tp));
  const char* pack = std::getenv("SERVAL_PACK_WEIGHTS");
  if (!(pack && std::string(pack) == "0")) m->pack_weights();
  return m;
}

void Model::pack_weights() {
  // The stored copy leaves the resident set once packed (the reference
  // forward still reads it: it faults back in, from the page cache).
  std::vector<std::pair<Matrix*, bool>> todo;  // (matrix, release its stored copy)
  ModelWeights& w = weights_;
  todo.emplace_back(&w.output, !w.tied_output);  // token_embd is read by row (embedding lookup): stays as stored
  for (LayerWeights& l : w.layers) {
    for (Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.router}) todo.emplace_back(m, true);
    for (auto* experts : {&l.exp_gate, &l.exp_up, &l.exp_down})
      for (Matrix& m : *experts) todo.emplace_back(&m, true);
  }
  // Matrices are packed on several threads (each is packed whole by one, so
  // the result does not depend on the thread count): loading is a model
  // switch's cost in router mode.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < todo.size(); i = next++) {
      Matrix& m = *todo[i].first;
      if (!m.data || !kernels::PackedMatrix::packable_data(m.type, m.data, m.rows, m.cols)) continue;
      m.packed =
          std::make_shared<const kernels::PackedMatrix>(kernels::PackedMatrix::pack(m.type, m.data, m.rows, m.cols));
      if (todo[i].second) file_.release(m.data, row_size(m.type, m.cols) * (size_t)m.rows);
    }
  };
  const size_t n = std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), 8, todo.size()});
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
}

Status Model::load_weights() {
  TensorLoader ld(file_);
  ModelConfig& c = config_;
  SERVAL_RETURN_IF_ERROR(c.family->load_tensors ? c.family->load_tensors(ld, c, weights_)
                                                 : load_standard(ld, c, weights_));
  c.n_vocab = weights_.token_embd.rows;
  // The tokenizer, when present, must agree with the embedding.
  if (auto toks = file_.get_array("tokenizer.ggml.tokens", gguf::ValueType::string); toks.ok()) {
    if ((int64_t)(*toks)->items.size() != c.n_vocab)
      return invalid_file("metadata key 'tokenizer.ggml.tokens': expected " + std::to_string(c.n_vocab) +
                          " tokens (rows of token_embd.weight), got " + std::to_string((*toks)->items.size()));
  }
  // Nothing that changes the math is ignored silently.
  const std::vector<std::string> extra = ld.unused();
  if (!extra.empty()) {
    std::string names;
    for (size_t i = 0; i < extra.size() && i < 4; ++i) names += (i ? ", '" : "'") + extra[i] + "'";
    if (extra.size() > 4) names += " and " + std::to_string(extra.size() - 4) + " more";
    return unsupported("tensor " + names + " is not used by the '" + c.arch +
                       "' family: refusing to run a model whose math would differ from the file's");
  }
  warnings_ = c.warnings;
  warnings_.insert(warnings_.end(), ld.warnings().begin(), ld.warnings().end());
  return {};
}

}  // namespace serval
