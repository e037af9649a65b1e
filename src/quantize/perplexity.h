// Accuracy of a model over a text, measured as llama.cpp's perplexity tool
// does: the tokens are cut into chunks of n_ctx (a trailing partial chunk is
// dropped), each chunk starts with BOS (when the model has one) in place of its
// first token and is evaluated from an empty cache, and only the second half
// of each chunk is scored (the first half is context): the log-probability of
// token j+1 given tokens 0..j, for j in [n_ctx/2, n_ctx-1).
//
// KL divergence against a reference: a "base" run saves the reference model's
// log-probabilities at every scored position (LogitsFile); a later run of
// another model (same vocab, same tokens) reports mean KL(base || this), the
// share of positions whose top token agrees, and the perplexity ratio.
//
// LogitsFile format (little-endian), our own:
//   char magic[4] "SVKL"; uint32 version (1); uint32 n_vocab; uint32 n_ctx;
//   uint32 n_chunks; uint32 reserved (0); int32 tokens[n_chunks * n_ctx]
//   then per scored position (n_chunks * (n_ctx - 1 - n_ctx/2) of them, chunk
//   by chunk): float lo, float step, uint16 q[n_vocab]  with
//   log p[v] ~= lo + step * q[v] (q = 0 at or below lo = max log p - 24).
// 2 bytes per vocab entry per position; reading checks the sizes against the
// file, the vocab size and (when given) the token sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model.h"
#include "quantize/imatrix.h"
#include "tensor/kv_type.h"

namespace serval::quant {

struct EvalOptions {
  int32_t n_ctx = 512;        // tokens per chunk (>= 16, <= the model's context)
  int32_t max_chunks = 0;     // 0: all whole chunks of the text
  KvType kv_type = KvType::f32;  // element type of the KV cache the chunks run with
  ThreadPool* pool = nullptr;
  // Called after each chunk: chunks done / total.
  std::function<void(int32_t, int32_t)> progress;
};

struct PerplexityResult {
  int32_t n_chunks = 0;
  int64_t n_scored = 0;
  double ppl = 0, ppl_err = 0;  // exp(mean NLL) and its standard error
};

struct KlResult {
  PerplexityResult ppl;         // this model
  double base_ppl = 0;          // the base model over the same positions
  double ppl_ratio = 0, ln_ratio = 0, ln_ratio_err = 0;  // mean(NLL_this - NLL_base) +- se
  double kl_mean = 0, kl_err = 0, kl_max = 0, kl_median = 0;
  double top1 = 0, top1_err = 0;  // share of positions where the argmax agrees
};

// The chunked token sequence a run evaluates (BOS put in place), n_chunks * n_ctx tokens.
// Errors: fewer than n_ctx tokens, n_ctx out of range.
Expected<std::vector<int32_t>> chunk_tokens(const std::vector<int32_t>& tokens, const Model& model,
                                            const EvalOptions& opt);

// Perplexity over chunked tokens (from chunk_tokens). When `save_path` is not
// empty, the log-probabilities are written there as a LogitsFile. When
// `imatrix` is set, its observer sees every matrix product and end_chunk() is
// called after each chunk.
Expected<PerplexityResult> perplexity(const Model& model, const std::vector<int32_t>& chunked, const EvalOptions& opt,
                                      const std::string& save_path = "", ImatrixCollector* imatrix = nullptr);

// Compares `model` with the LogitsFile at base_path, over the tokens stored in
// it (opt.n_ctx is taken from the file). `expect_tokens`, when not empty, must
// equal the stored tokens. Errors: bad or truncated file, vocab or token mismatch.
Expected<KlResult> kl_divergence(const Model& model, const std::string& base_path, const EvalOptions& opt,
                                 const std::vector<int32_t>& expect_tokens = {});

}  // namespace serval::quant
