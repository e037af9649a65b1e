#include "quantize/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>

#include "common/mapped_file.h"
#include "kv_cache/kv_storage.h"
#include "model/batch_forward.h"

namespace serval::quant {
namespace {

constexpr char kMagic[4] = {'S', 'V', 'K', 'L'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 24;
constexpr float kLogProbRange = 24.0f;  // nats kept below the top log-prob
constexpr int32_t kUbatch = 512;        // tokens per forward call
constexpr int32_t kBlock = 16;

int32_t first_scored(int32_t n_ctx) { return n_ctx / 2; }
int32_t scored_per_chunk(int32_t n_ctx) { return n_ctx - 1 - first_scored(n_ctx); }

// Runs one chunk from an empty cache and returns the log-softmax of the
// positions [first, n_ctx - 1) as rows of n_vocab.
class ChunkRunner {
 public:
  static Expected<std::unique_ptr<ChunkRunner>> create(const Model& m, int32_t n_ctx, KvType kv_type,
                                                       ThreadPool* pool) {
    const ModelConfig& c = m.config();
    if (std::string why = kv_type_check(kv_type, c.head_dim); !why.empty()) return invalid_argument(why);
    KvGeometry g{(int32_t)c.n_layers, (int32_t)c.kv_dim(), kBlock, kv_type};
    auto kv = KvStorage::create(g, (n_ctx + kBlock - 1) / kBlock);
    if (!kv.ok()) return kv.status();
    return std::unique_ptr<ChunkRunner>(new ChunkRunner(m, std::move(kv.value()), n_ctx, pool));
  }

  void set_observer(const MatmulObserver* obs) { fwd_.set_observer(obs); }

  // logprobs: [scored_per_chunk(n_ctx), n_vocab]
  Status run(const int32_t* toks, std::vector<float>* logprobs) {
    const int32_t first = first_scored(n_ctx_);
    const int64_t n_vocab = model_.config().n_vocab;
    logprobs->clear();
    Batch b;
    for (int32_t at = 0; at < n_ctx_; at += kUbatch) {
      const int32_t n = std::min(kUbatch, n_ctx_ - at);
      const int32_t end = at + n;
      b.tokens.assign(toks + at, toks + end);
      const bool want = end > first;
      const int32_t n_logits = want ? end - std::max(at, first) : 1;
      b.seqs = {BatchSeq{at, n, table_, want, n_logits}};
      SERVAL_RETURN_IF_ERROR(fwd_.forward(b, &logits_));
      if (want) logprobs->insert(logprobs->end(), logits_.begin(), logits_.end());
    }
    // The last position predicts nothing inside the chunk.
    logprobs->resize((size_t)(scored_per_chunk(n_ctx_) * n_vocab));
    for (int64_t r = 0; r < scored_per_chunk(n_ctx_); ++r) {
      float* row = logprobs->data() + r * n_vocab;
      const float mx = *std::max_element(row, row + n_vocab);
      double s = 0;
      for (int64_t v = 0; v < n_vocab; ++v) s += std::exp((double)row[v] - mx);
      const float lse = mx + (float)std::log(s);
      for (int64_t v = 0; v < n_vocab; ++v) row[v] -= lse;
    }
    return {};
  }

 private:
  ChunkRunner(const Model& m, KvStorage kv, int32_t n_ctx, ThreadPool* pool)
      : model_(m), kv_(std::move(kv)), fwd_(m, kv_, pool), n_ctx_(n_ctx) {
    for (BlockId i = 0; i < kv_.n_blocks(); ++i) table_.push_back(i);
  }

  const Model& model_;
  KvStorage kv_;
  BatchForward fwd_;
  int32_t n_ctx_;
  std::vector<BlockId> table_;
  std::vector<float> logits_;
};

// Mean and standard error of a running sum.
struct Stat {
  double s = 0, s2 = 0;
  int64_t n = 0;
  void add(double x) {
    s += x;
    s2 += x * x;
    ++n;
  }
  double mean() const { return n ? s / (double)n : 0; }
  double err() const {
    if (n < 2) return 0;
    const double m = mean();
    return std::sqrt(std::max(0.0, s2 / (double)n - m * m) / (double)(n - 1));
  }
};

Status check_ctx(const Model& model, int32_t n_ctx) {
  const int64_t max_ctx = model.config().n_ctx_train;
  if (n_ctx < 16 || (max_ctx > 0 && n_ctx > max_ctx))
    return invalid_argument("context size " + std::to_string(n_ctx) + " is out of range [16, " +
                            std::to_string(max_ctx) + "]");
  return {};
}

}  // namespace

Expected<std::vector<int32_t>> chunk_tokens(const std::vector<int32_t>& tokens, const Model& model,
                                            const EvalOptions& opt) {
  SERVAL_RETURN_IF_ERROR(check_ctx(model, opt.n_ctx));
  int64_t n_chunks = (int64_t)tokens.size() / opt.n_ctx;
  if (opt.max_chunks > 0) n_chunks = std::min<int64_t>(n_chunks, opt.max_chunks);
  if (n_chunks < 1)
    return invalid_argument("the text has " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of " +
                            std::to_string(opt.n_ctx) + " (lower --ctx or use a longer text)");
  std::vector<int32_t> out(tokens.begin(), tokens.begin() + n_chunks * opt.n_ctx);
  int32_t bos = -1;
  if (auto b = model.file().get_uint("tokenizer.ggml.bos_token_id"); b.ok() && (int64_t)*b < model.config().n_vocab)
    bos = (int32_t)*b;
  if (bos >= 0)
    for (int64_t c = 0; c < n_chunks; ++c) out[(size_t)(c * opt.n_ctx)] = bos;
  return out;
}

Expected<PerplexityResult> perplexity(const Model& model, const std::vector<int32_t>& chunked, const EvalOptions& opt,
                                      const std::string& save_path, ImatrixCollector* imatrix) {
  SERVAL_RETURN_IF_ERROR(check_ctx(model, opt.n_ctx));
  const int32_t n_ctx = opt.n_ctx;
  const int32_t n_chunks = (int32_t)(chunked.size() / (size_t)n_ctx);
  if (n_chunks < 1 || chunked.size() % (size_t)n_ctx != 0)
    return invalid_argument("token count " + std::to_string(chunked.size()) + " is not a whole number of chunks");
  auto runner = ChunkRunner::create(model, n_ctx, opt.kv_type, opt.pool);
  if (!runner.ok()) return runner.status();
  if (imatrix) (*runner)->set_observer(imatrix->observer());
  const int64_t n_vocab = model.config().n_vocab;

  std::ofstream out;
  std::string tmp;
  if (!save_path.empty()) {
    tmp = save_path + ".tmp";
    out.open(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return io_error("cannot write '" + tmp + "'");
    const uint32_t head[5] = {kVersion, (uint32_t)n_vocab, (uint32_t)n_ctx, (uint32_t)n_chunks, 0};
    out.write(kMagic, 4);
    out.write(reinterpret_cast<const char*>(head), sizeof head);
    out.write(reinterpret_cast<const char*>(chunked.data()), (std::streamsize)(chunked.size() * 4));
  }
  Stat nll;
  std::vector<float> lp;
  std::vector<uint16_t> q((size_t)n_vocab);
  const int32_t first = first_scored(n_ctx);
  for (int32_t c = 0; c < n_chunks; ++c) {
    const int32_t* toks = chunked.data() + (size_t)c * n_ctx;
    SERVAL_RETURN_IF_ERROR((*runner)->run(toks, &lp));
    if (imatrix) imatrix->end_chunk();
    for (int32_t r = 0; r < scored_per_chunk(n_ctx); ++r) {
      const float* row = lp.data() + (size_t)r * n_vocab;
      nll.add(-(double)row[toks[first + r + 1]]);
      if (!out.is_open()) continue;
      const float lo = *std::max_element(row, row + n_vocab) - kLogProbRange;
      const float step = kLogProbRange / 65535.0f;
      for (int64_t v = 0; v < n_vocab; ++v)
        q[(size_t)v] = (uint16_t)std::clamp(std::lround((row[v] - lo) / step), 0l, 65535l);
      out.write(reinterpret_cast<const char*>(&lo), 4);
      out.write(reinterpret_cast<const char*>(&step), 4);
      out.write(reinterpret_cast<const char*>(q.data()), (std::streamsize)(q.size() * 2));
    }
    if (opt.progress) opt.progress(c + 1, n_chunks);
  }
  if (out.is_open()) {
    if (!out.flush()) return io_error("writing '" + tmp + "' failed");
    out.close();
    if (std::rename(tmp.c_str(), save_path.c_str()) != 0) return io_error("cannot rename '" + tmp + "'");
  }
  PerplexityResult res;
  res.n_chunks = n_chunks;
  res.n_scored = nll.n;
  res.ppl = std::exp(nll.mean());
  res.ppl_err = res.ppl * nll.err();
  return res;
}

Expected<KlResult> kl_divergence(const Model& model, const std::string& base_path, const EvalOptions& opt,
                                 const std::vector<int32_t>& expect_tokens) {
  auto f = MappedFile::open(base_path);
  if (!f.ok()) return f.status();
  const std::string ctx = "logits file '" + base_path + "'";
  if (f->size() < kHeaderBytes || std::memcmp(f->data(), kMagic, 4) != 0)
    return invalid_file(ctx + ": not a serval logits file (bad magic)");
  uint32_t head[5];
  std::memcpy(head, f->data() + 4, sizeof head);
  const uint32_t version = head[0], n_vocab = head[1], n_ctx = head[2], n_chunks = head[3];
  if (version != kVersion) return invalid_file(ctx + ": version " + std::to_string(version) + ", expected 1");
  if ((int64_t)n_vocab != model.config().n_vocab)
    return invalid_argument(ctx + ": vocab of " + std::to_string(n_vocab) + " tokens, the model has " +
                            std::to_string(model.config().n_vocab));
  if (n_ctx > (1u << 24)) return invalid_file(ctx + ": n_ctx " + std::to_string(n_ctx) + " out of range");
  SERVAL_RETURN_IF_ERROR(check_ctx(model, (int32_t)n_ctx).with_context(ctx));
  // Bounded before any product below, so none overflows: <= 2^20 chunks of <= 2^24 tokens.
  if (n_chunks < 1 || n_chunks > (1u << 20))
    return invalid_file(ctx + ": chunk count " + std::to_string(n_chunks) + " out of range");
  const uint64_t row_bytes = 8 + 2ull * n_vocab;
  const uint64_t n_tok = (uint64_t)n_chunks * n_ctx;
  if (4 * n_tok > f->size()) return invalid_file(ctx + ": truncated (the tokens do not fit)");
  // Now n_chunks * scored <= n_tok <= size / 4, so `want` cannot overflow.
  const uint64_t want = kHeaderBytes + 4 * n_tok + (uint64_t)n_chunks * scored_per_chunk((int32_t)n_ctx) * row_bytes;
  if (f->size() != want)
    return invalid_file(ctx + ": " + std::to_string(f->size()) + " bytes, expected " + std::to_string(want) +
                        " for " + std::to_string(n_chunks) + " chunks");
  std::vector<int32_t> tokens(n_tok);
  std::memcpy(tokens.data(), f->data() + kHeaderBytes, n_tok * 4);
  for (int32_t t : tokens)
    if (t < 0 || t >= (int32_t)n_vocab) return invalid_file(ctx + ": token id " + std::to_string(t) + " out of range");
  if (!expect_tokens.empty() && expect_tokens != tokens)
    return invalid_argument(ctx + ": its tokens differ from this text's (other text, --ctx or tokenizer?)");

  EvalOptions o = opt;
  o.n_ctx = (int32_t)n_ctx;
  auto runner = ChunkRunner::create(model, o.n_ctx, o.kv_type, o.pool);
  if (!runner.ok()) return runner.status();
  Stat nll, nll_base, dnll, kl, top1;
  std::vector<double> kls;
  std::vector<float> lp, base((size_t)n_vocab);
  const uint8_t* rows = f->data() + kHeaderBytes + 4 * n_tok;
  const int32_t first = first_scored(o.n_ctx);
  for (uint32_t c = 0; c < n_chunks; ++c) {
    const int32_t* toks = tokens.data() + (size_t)c * n_ctx;
    SERVAL_RETURN_IF_ERROR((*runner)->run(toks, &lp));
    for (int32_t r = 0; r < scored_per_chunk(o.n_ctx); ++r, rows += row_bytes) {
      float lo, step;
      std::memcpy(&lo, rows, 4);
      std::memcpy(&step, rows + 4, 4);
      if (!std::isfinite(lo) || !std::isfinite(step) || step <= 0 || step > 1)
        return invalid_file(ctx + ": bad row scale");
      const uint8_t* qs = rows + 8;
      double s = 0;
      for (uint32_t v = 0; v < n_vocab; ++v) {
        uint16_t qv;
        std::memcpy(&qv, qs + 2 * v, 2);
        base[v] = lo + step * qv;
        s += std::exp((double)base[v]);
      }
      const float lse = (float)std::log(s);
      const float* row = lp.data() + (size_t)r * n_vocab;
      double d = 0;
      for (uint32_t v = 0; v < n_vocab; ++v) {
        base[v] -= lse;
        d += std::exp((double)base[v]) * ((double)base[v] - row[v]);
      }
      d = std::max(d, 0.0);
      kl.add(d);
      kls.push_back(d);
      const int32_t next = toks[first + r + 1];
      nll.add(-(double)row[next]);
      nll_base.add(-(double)base[(size_t)next]);
      dnll.add((double)base[(size_t)next] - row[next]);
      const auto am = [&](const float* x) { return std::max_element(x, x + n_vocab) - x; };
      top1.add(am(base.data()) == am(row) ? 1.0 : 0.0);
    }
    if (o.progress) o.progress((int32_t)c + 1, (int32_t)n_chunks);
  }
  KlResult res;
  res.ppl.n_chunks = (int32_t)n_chunks;
  res.ppl.n_scored = nll.n;
  res.ppl.ppl = std::exp(nll.mean());
  res.ppl.ppl_err = res.ppl.ppl * nll.err();
  res.base_ppl = std::exp(nll_base.mean());
  res.ln_ratio = dnll.mean();
  res.ln_ratio_err = dnll.err();
  res.ppl_ratio = std::exp(res.ln_ratio);
  res.kl_mean = kl.mean();
  res.kl_err = kl.err();
  std::sort(kls.begin(), kls.end());
  res.kl_max = kls.back();
  res.kl_median = kls[kls.size() / 2];
  res.top1 = top1.mean();
  res.top1_err = std::sqrt(res.top1 * (1 - res.top1) / (double)std::max<int64_t>(1, top1.n - 1));
  return res;
}

}  // namespace serval::quant
