// serval's engine API: many requests share one model and one paged KV pool,
// join and leave the running batch at every step (continuous batching), and
// reuse each other's prompt prefixes.
//
// Threads: submit()/cancel()/stats() may be called from any thread. One engine
// loop thread owns the scheduler, the KV cache and the model forward; requests
// reach it through an inbox and results come back through each request's
// RequestStream (a thread-safe queue). Nothing the loop owns is touched by
// caller threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "kv_cache/kv_tier.h"
#include "model/model_config.h"
#include "sampler/logprobs.h"
#include "sampler/stop_conditions.h"
#include "serval/sampling_params.h"
#include "serval/types.h"
#include "tensor/kv_type.h"

namespace serval {

class TensorParallelLink;  // engine/tensor_parallel_link.h

class Model;
class ThreadPool;
class Tokenizer;

// Speculative decoding (docs/SPECULATIVE.md): drafted tokens are verified by
// the target in the same batched forward; the output is exactly what the
// target alone would produce (greedy: token-identical; sampling: the same
// distribution).
struct SpecConfig {
  enum class Mode { none, ngram, draft_model };
  Mode mode = Mode::none;
  std::shared_ptr<const Model> draft_model;  // Mode::draft_model; must share the target's vocabulary
  int32_t draft_max = 5;  // most drafted tokens per sequence and step (1..64)
  int32_t draft_min = 0;  // shorter n-gram drafts are not verified; floor of the adaptive length (0: may pause)
  int32_t ngram_min = 1, ngram_max = 4;  // n-gram sizes tried, longest first (1..64)
};

struct EngineConfig {
  int n_threads = 0;                    // 0: physical cores
  // Compute threads shared with other engines in this process (several
  // models behind one server: their steps' parallel_fors take turns);
  // null: the engine makes its own pool of n_threads.
  std::shared_ptr<ThreadPool> pool;
  size_t kv_memory_bytes = 256u << 20;  // device KV pool; see parse_kv_memory()
  size_t swap_memory_bytes = 0;         // host swap space for preemption by swapping (0: recompute only)
  int32_t block_size = 16;              // tokens per KV block
  KvType kv_type = KvType::f16;         // KV element type (--kv-type; tensor/kv_type.h); f16 as in llama.cpp
  int32_t max_batch_tokens = 512;       // token budget of one step
  int32_t max_seqs = 64;                // sequences in one step
  int64_t max_model_len = 0;            // context per sequence; 0: the model's (at most 4096)
  bool enable_prefix_caching = true;
  // Lower tiers of the prefix cache (kv_cache/tiered_store.h): cached blocks
  // the pool evicts go to host RAM (kv_cache_ram_bytes), from there to disk
  // (kv_cache_dir, at most kv_cache_disk_bytes), and come back on a prefix
  // hit. The disk tier survives restarts. Off when both are 0 / empty; need
  // prefix caching and a model without a sliding-window pool.
  size_t kv_cache_ram_bytes = 0;
  std::string kv_cache_dir;
  size_t kv_cache_disk_bytes = 0;
  // Sliding-window layers (gemma2/3, phi3 with a window) keep only their
  // window's KV blocks, in a pool of their own (kv_cache_manager.h); true keeps
  // the whole context for them too (llama.cpp's --swa-full). Swapping
  // (swap_memory_bytes) is off while the window bound is on: preemption recomputes.
  bool swa_full = false;
  bool enable_chunked_prefill = true;
  double aging_per_step = 0.01;         // priority aging (see scheduler)
  // Background requests (priority >= this; batch jobs) run after every other
  // one, yield the steps in which another request prefills, and get at most
  // background_prefill_tokens prompt tokens of a step (0: no own cap). INT32_MAX: off.
  int32_t background_priority = INT32_MAX;
  int32_t background_prefill_tokens = 0;
  int32_t max_n = 16;                   // bound on Request::n
  int32_t max_beam_width = 16;          // bound on beam_width and contrastive top_k (<= max_seqs too)
  SpecConfig spec;                      // off by default
  // Embeddings (Engine::embed): the pooling of a decoder model that names
  // none in its file (--pooling; Pooling::none: the file's), and the most
  // inputs one embed() call may carry.
  Pooling pooling = Pooling::none;
  int32_t max_embed_inputs = 2048;
  // LoRA adapters held in memory at once (--max-loras); 0: all. Past it, the
  // least recently used adapter with no request running is dropped from
  // memory (it stays loaded: its next request reads its file again).
  int32_t max_loras = 0;
  // Tensor parallelism: the model is rank 0's shard (Model::load with a
  // TensorParallel) and this links it to the other ranks (engine/
  // tensor_parallel_link.h; parallel/mpi_link.h over MPI). Must outlive the
  // engine. Not with a draft model, swap space, KV tiers, a sliding-window
  // pool or pooling.
  TensorParallelLink* tp = nullptr;
};

// Parses --kv-memory: bytes with an optional K/M/G/T suffix ("512M", "2G",
// "1073741824") or a fraction of the available RAM ("0.25"). Errors name the text.
Expected<size_t> parse_kv_memory(const std::string& text);

struct Request {
  std::vector<TokenId> prompt;  // token ids (BOS included if wanted)
  SamplingParams params;
  int32_t n = 1;                // parallel samples; they share the prompt's KV blocks
  int32_t priority = 0;         // lower = more important (vLLM convention)
  uint64_t tenant_salt = 0;     // prefix-cache isolation between tenants
  bool speculate = true;        // use the engine's speculative decoding, if configured
  // Log-probabilities of the prompt (OpenAI `echo` + `logprobs`, vLLM
  // `prompt_logprobs`): -1 = off; N in [0, 20] = every prompt token after the
  // first gets its log-prob and the N most likely tokens at its position
  // (TokenLogprobs, as for generated tokens), delivered on sample 0's first
  // event. Such a request computes its prompt from position 0 (no prefix-cache
  // hit can skip positions), in chunks whose every logits row is kept, and
  // does not speculate. Beam and contrastive search refuse it.
  int32_t prompt_logprobs = -1;
  // Score only: with prompt_logprobs >= 0 and n == 1, params.max_tokens may
  // be 0 — the prompt is scored and nothing is generated (finish: length).
  // A LoRA adapter loaded with Engine::load_lora, by name; empty: the base
  // model. The request keeps the adapter alive until it finishes (an unload
  // meanwhile only stops new requests from using it); its prefix-cache
  // blocks are its own (the adapter's id is part of the prefix key).
  std::string lora;
};

// A LoRA adapter the engine holds (Engine::loras()).
struct LoraInfo {
  std::string name, path;
  float scale = 1.0f;      // the effective scale: user scale x alpha / rank
  float user_scale = 1.0f; // the scale it was loaded with
  bool resident = true;    // in memory (else read again on its next request: EngineConfig::max_loras)
  int64_t rank = 0;
  int64_t n_matrices = 0;  // base matrices it adapts
  int64_t bytes = 0;       // its F32 copies (in memory while resident)
  int64_t reloads = 0;     // times it was read again after being dropped from memory
  uint64_t id = 0;         // its prefix-cache key (never reused)
};

// Where a request's time went inside the engine (steady_clock nanoseconds since
// its epoch; 0 = did not happen). Filled on each sample's last event only, so
// the per-token path carries nothing extra.
struct RequestTiming {
  struct Chunk {
    int64_t start_ns = 0, end_ns = 0;  // the engine step that ran it
    int64_t n_tokens = 0;
  };
  int64_t arrival_ns = 0;      // submit()
  int64_t scheduled_ns = 0;    // start of the first step that ran the request (end of queueing)
  int64_t first_token_ns = 0;  // end of the step that sampled this sample's first token
  int64_t finished_ns = 0;     // end of the step that finished this sample
  std::vector<Chunk> prefill_chunks;  // steps that ran prompt tokens (chunked prefill, recompute); at most 64
  int64_t detokenize_ns = 0;   // time spent detokenizing and matching stop strings for this sample
  double compute_s = 0;        // this sample's share of step wall time (by tokens in each step)
};

struct OutputEvent {
  int32_t index = 0;                    // which sample, [0, n)
  std::vector<TokenId> tokens;          // tokens generated since the previous event of this sample
  std::string text;                     // their text (UTF-8 safe; stop strings cut)
  std::vector<TokenLogprobs> logprobs;  // one per token when params.logprobs > 0
  // Request::prompt_logprobs >= 0, on sample 0's first event: one entry per
  // prompt position 1 .. prompt.size() - 1 (`chosen` is the prompt token).
  std::vector<TokenLogprobs> prompt_logprobs;
  FinishReason finish = FinishReason::none;  // set on the sample's last event
  // finish == stop: the stop string that ended the sample (an index into
  // params.stop; -1: none), or the stop_token_ids token that did (-1: none).
  // Both -1: an end-of-generation token of the model.
  int32_t stop_string = -1;
  TokenId stop_token = -1;
  Status error;                         // non-ok: the request failed; no more events follow
  int64_t time_ns = 0;                  // steady_clock ns when the engine produced it (end of its step)
  // Filled on a sample's last event:
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;     // prompt tokens served from the prefix cache
  int64_t completion_tokens = 0;
  RequestTiming timing;
  // Beam search, on each sample's (only) event: the hypothesis' score,
  // sum_logprob / n_tokens^length_penalty; samples come best first.
  std::optional<double> search_score;
};

// The caller's end of one request. Thread-safe.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id, int32_t n) : id_(id), open_samples_(n) {}
  uint64_t id() const { return id_; }

  // Blocks for the next event; false when every sample has finished and all
  // events were read (or the request failed and its error event was read).
  bool next(OutputEvent* ev);
  // Like next() but gives up after timeout_ms (returns false; check done()).
  bool next_for(OutputEvent* ev, int64_t timeout_ms);
  bool done() const;

  // Called (from the engine thread) after each push; must be cheap and must
  // not call back into the stream's blocking functions. Set it before the
  // stream can receive events (right after submit) or accept that the first
  // events may already be queued: call next_for(ev, 0) once after setting it.
  void set_notify(std::function<void()> fn);

  // --- engine side ---
  void push(OutputEvent ev);

 private:
  std::function<void()> notify_;
  const uint64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<OutputEvent> q_;
  int32_t open_samples_;
  bool failed_ = false;
};

// Embeddings and rerank scores (Engine::embed): whole inputs, each pooled
// into one vector by the model's pooling (rank: one score), computed many
// inputs per engine step between generation steps, with no KV kept.
struct EmbedRequest {
  std::vector<std::vector<TokenId>> inputs;  // each non-empty, within the context
};

// The caller's end of one embed() call. Thread-safe.
class EmbedHandle {
 public:
  // Blocks until done (timeout_ms < 0: no limit); false on timeout.
  bool wait(int64_t timeout_ms = -1);
  bool done() const;
  // Called once (from the engine thread) when the result is ready; if it is
  // already, at once on the calling thread.
  void set_notify(std::function<void()> fn);
  // Stops computing the inputs not started yet; the handle completes with an
  // error.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // After done(): ok, or why it failed.
  Status error;
  // After done(): [inputs, dim] floats, unnormalized (rank: dim 1, the scores).
  std::vector<float> data;
  int64_t dim = 0;
  int64_t prompt_tokens = 0;

  // --- engine side ---
  void finish();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> notify_;
  bool done_ = false;
  std::atomic<bool> cancelled_{false};
};

// What callers above the engine (server, CLI) may know about the model.
struct EngineInfo {
  std::string model_name;     // general.name, else the file name
  std::string architecture;
  int64_t n_vocab = 0;
  int64_t max_model_len = 0;  // context per sequence
  std::string chat_template;  // tokenizer.chat_template; empty when absent
  size_t kv_bytes_per_token = 0;  // KV memory one token takes (all layers, K and V; + the draft model's)
  bool generates = true;          // false for encoders (bert, nomic-bert): embed() only
  Pooling pooling = Pooling::none;  // what embed() applies; none: the model does not embed
  int64_t embedding_dim = 0;        // floats per input from embed() (rank: 1); 0 without pooling
  int64_t max_embed_len = 0;        // tokens one embed() input may have
  std::string kernels;              // the kernel level the forward runs at ("avx2", "avx512vnni", ...)
};

struct EngineStats {
  int64_t steps = 0;
  int64_t requests_finished = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t prefill_tokens_computed = 0;  // prompt tokens actually run (after prefix hits, incl. recompute)
  int64_t preemptions = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int32_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_peak = 0;
  // The sliding-window pool (0 without one): its blocks, and how many were
  // released behind the window. Bytes per block of each pool (K and V, all its layers).
  int32_t kv_swa_blocks_total = 0, kv_swa_blocks_used = 0, kv_swa_blocks_peak = 0;
  int64_t kv_swa_blocks_released = 0;
  size_t kv_bytes_per_block = 0, kv_swa_bytes_per_block = 0;
  // KV bytes one sequence holds (its blocks in both pools), the most seen: in
  // any step, in a decode step (one token: the steady state), and what full
  // attention would hold for that decode step's sequence.
  size_t kv_seq_bytes_peak = 0, kv_seq_bytes_decode_peak = 0, kv_seq_bytes_decode_full = 0;
  // Mixture-of-experts models: tokens the router sent to each expert (of the
  // target model, every forward so far), [n_layers * n_expert] layer-major,
  // and n_expert; empty / 0 for dense models.
  std::vector<int64_t> expert_tokens;
  int32_t n_expert = 0;
  double kv_waste_ratio = 0;            // unfilled slots / allocated slots, averaged over steps
  size_t running = 0, waiting = 0;
  // LoRA adapters (by name, sorted) with a request started / only queued,
  // and the most held at once (EngineConfig::max_loras, else kMaxLoras; 0
  // while no adapter is loaded).
  std::vector<std::string> lora_running, lora_waiting;
  int32_t max_loras = 0;
  int64_t prefix_cached_blocks = 0;     // blocks held by the prefix cache (in use or reusable)
  // Lower tiers: their counters, the prompt tokens served from them (part of
  // prefix_hit_tokens) and tier blocks that failed their check on load.
  KvTierStats kv_tiers;
  int64_t tier_hit_tokens = 0, tier_load_failures = 0;
  // Speculative decoding: verifications of a non-empty draft, drafted tokens,
  // accepted drafted tokens, and their ratio (accepted drafts per verification;
  // each verification also yields one token of the target's own).
  int64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  double spec_mean_accepted = 0;
  double step_seconds = 0;              // wall time spent in engine steps (forward + sampling)
  // Steps that ran no prompt token (each sequence one decode token: no
  // prefill chunk, no speculative verification), the tokens they generated
  // and their wall time: tokens / seconds is the batched decode step's own
  // rate (llama-batched-bench's S_TG), free of other requests' prefill.
  int64_t decode_steps = 0, decode_step_tokens = 0;
  double decode_step_seconds = 0;
  // Mixture-of-experts models, in those decode-only steps: MoE layer passes
  // and the expert weight sets they read (an expert routed any of a step's
  // tokens is read once for all of them). reads / passes is the experts read
  // per layer and step: n_expert_used at one sequence, up to n_expert.
  int64_t decode_step_moe_passes = 0, decode_step_expert_reads = 0;
  // Embeddings: inputs and their tokens computed, embedding steps and their wall time.
  int64_t embed_inputs = 0, embed_tokens = 0, embed_steps = 0;
  double embed_seconds = 0;
};

class Engine {
 public:
  // Takes the model; the tokenizer is copied. Starts the loop thread.
  static Expected<std::unique_ptr<Engine>> create(std::shared_ptr<const Model> model, const Tokenizer& tok,
                                                  EngineConfig cfg);
  ~Engine();  // stops the loop; requests still open get an error event
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (prompt empty/too long, token ids, sampling params, n) and queues.
  Expected<std::shared_ptr<RequestStream>> submit(Request req);
  // Embeddings (see EmbedRequest). Validates (no pooling / a model that does
  // not embed, no inputs, more than max_embed_inputs, an empty or too long
  // input, token ids) and queues. (Encoders, in turn, refuse submit().)
  Expected<std::shared_ptr<EmbedHandle>> embed(EmbedRequest req);
  // Cancels a request in any state; its KV blocks are freed within one step.
  void cancel(uint64_t request_id);

  // Saved prefixes (sessions) on the disk tier (kv_cache_dir). For the full
  // blocks of `tokens` under a tenant's salt, as far as they are cached in
  // the pool or a tier:
  //   pin      copies them to the disk tier, which keeps them out of its LRU
  //            eviction (pins nest: one per saved session holding a block)
  //   unpin    drops one pin of each
  //   restore  loads them into the pool (as a prefix hit would), so that the
  //            next request with this prefix computes none of it
  // `done` gets the prefix tokens the operation covered (0 when nothing of
  // the prefix is cached) or an error (no disk tier, the disk budget full of
  // pinned blocks); it runs on the engine thread, or on the caller's for an
  // error found at once.
  enum class PrefixOp { pin, unpin, restore };
  void prefix_op(PrefixOp op, std::vector<TokenId> tokens, uint64_t tenant_salt,
                 std::function<void(Expected<int64_t>)> done);

  // LoRA adapters (model/lora.h; llama.cpp's GGUF adapter format), applied
  // per request on top of the shared base weights — requests for different
  // adapters and the base run in the same steps. load_lora reads and checks
  // the file on the calling thread (errors name the tensor or key), then
  // makes it available under `name` (invalid_argument if taken; at most
  // kMaxLoras, resource_exhausted beyond). unload_lora: not_found if absent;
  // requests already submitted with it finish with it. Thread-safe.
  Status load_lora(const std::string& name, const std::string& path, float scale = 1.0f);
  Status unload_lora(const std::string& name);
  std::vector<LoraInfo> loras() const;
  static constexpr int kMaxLoras = 256;

  // Stepping control (vLLM's pause_generation), for tests that need a given
  // interleaving and for operators draining a replica. After pause() returns
  // the loop is parked between steps: no step runs until resume() or step(),
  // requests submitted meanwhile wait in the inbox (admitted together by the
  // next step), and stats() is current. step(n) runs n loop iterations while
  // paused and returns parked again; an iteration with nothing to do ends the
  // call early. Either may be called from any thread but the loop's.
  void pause();
  void resume();
  void step(int n = 1);
  bool paused() const;

  EngineStats stats() const;
  EngineInfo info() const;
  const Tokenizer& tokenizer() const;
  const Model& model() const;
  const EngineConfig& config() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  Status check_search_request(const Request& req, int64_t max_total) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace serval
