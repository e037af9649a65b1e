// The engine's internals, shared by its files (nothing outside src/engine
// includes this):
//   engine.cpp             the public API: create, submit, cancel, pause, stats
//   engine_loop.cpp        the request lifecycle and the step loop
//   engine_speculative.cpp speculative decoding: propose drafts, verify them
//   engine_search.cpp      beam and contrastive search inside the step loop
// Everything in Impl but the inbox, the stepping control and the stats is
// owned by the loop thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "engine/runner.h"
#include "engine/search_decoding.h"
#include "kv_cache/kv_cache_manager.h"
#include "kv_cache/kv_storage.h"
#include "kv_cache/tiered_store.h"
#include "model/embed_forward.h"
#include "model/model.h"
#include "sampler/grammar/matcher.h"
#include "sampler/sampler.h"
#include "sampler/stop_matcher.h"
#include "scheduler/scheduler.h"
#include "serval/engine.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace engine_detail {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr size_t kMaxTimedChunks = 64;  // RequestTiming::prefill_chunks bound
// Prompt log-probs: the logits rows one chunk of such a request may hold (its
// chunks are capped to this many bytes of rows, at least 16 rows).
constexpr size_t kPromptLogitsBytes = size_t{64} << 20;

}  // namespace engine_detail

struct Engine::Impl {
  struct RequestState;

  struct SeqState {
    RequestState* req = nullptr;
    int32_t index = 0;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<StreamingDetokenizer> detok;
    std::unique_ptr<StopMatcher> stop;
    std::unique_ptr<GrammarMatcher> grammar;  // params.grammar's state for this sequence
    std::vector<uint64_t> grammar_mask;       // scratch: allowed tokens
    // Draft model: picks draft tokens with the request's processors; q[j] is
    // the distribution draft token j of this step was drawn from (sampling).
    std::unique_ptr<Sampler> draft_sampler;
    std::vector<std::vector<Candidate>> q;
    std::vector<TokenId> draft_history;
    int32_t n_generated = 0;
    int64_t cached_prompt_tokens = -1;  // start_pos of the first scheduled chunk: the prefix-cache hit
    bool finished = false;
    int64_t first_token_ns = 0, detokenize_ns = 0;
    double compute_s = 0;
  };

  // Beam or contrastive search of one request (search_decoding.h). Its seqs
  // get bare SeqStates; `out` samples (processed logits), detokenizes and
  // stops on behalf of the request.
  struct SearchState {
    std::unique_ptr<SeqState> out;
    std::unique_ptr<BeamSearch> beam;
    HeldRows rows;  // beam: log-probs; contrastive: processed logits, per live seq
    // Contrastive: the seq whose context is committed, the candidates forked
    // from it (cand_seqs[0] == main after an expansion; empty before the
    // first), their last hidden states and the context's hidden states.
    SeqId main = 0;
    std::vector<ContrastiveCandidate> cands;
    std::vector<SeqId> cand_seqs;
    HeldRows hidden;
    std::vector<float> ctx_hidden;  // [positions, dim]
    std::vector<SeqId> live() const {
      if (beam) return beam->live_seqs();
      return cand_seqs.empty() ? std::vector<SeqId>{main} : cand_seqs;
    }
  };

  struct RequestState {
    uint64_t id = 0;
    std::unique_ptr<SearchState> search;
    int64_t cached_prompt_tokens = -1;  // the first chunk's start: the prefix-cache hit
    Request req;
    std::shared_ptr<RequestStream> stream;
    std::vector<SeqId> seqs;       // [n]; children get ids when forked
    int32_t n_open = 0;
    bool children_forked = false;
    int64_t max_total = 0;         // prompt + max new tokens, capped by the context
    int64_t arrival_ns = 0, scheduled_ns = 0;
    std::vector<RequestTiming::Chunk> prefill_chunks;
    // Request::prompt_logprobs: the prompt positions scored so far ([1,
    // prompt_lp_next)), held until sample 0's first event carries them.
    std::vector<TokenLogprobs> prompt_lp;
    int64_t prompt_lp_next = 1;
    bool prompt_lp_sent = false;
    std::shared_ptr<const LoraAdapter> lora;  // Request::lora resolved at submit (null: the base)
    uint64_t lora_id = 0;                     // its prefix-key id
    bool score_only() const { return req.prompt_logprobs >= 0 && req.params.max_tokens == 0; }
  };

  std::shared_ptr<const Model> model;
  // LoRA adapters by name (Engine::load_lora), under lora_mu.
  struct LoraEntry {
    std::shared_ptr<const LoraAdapter> adapter;  // null while not resident
    LoraInfo info;
    uint64_t last_used = 0;  // lora_clock at its last request
    std::string file_stamp;  // size and mtime of its file when read (a changed file gets a new prefix id)
  };
  uint64_t lora_clock = 0;
  // With cfg.max_loras: drops least recently used idle adapters from memory
  // until at most max_loras are resident (lora_mu held).
  void trim_loras();
  mutable std::mutex lora_mu;
  std::map<std::string, LoraEntry> loras;
  uint64_t next_lora_id = 1;
  Tokenizer tok;
  EngineConfig cfg;
  std::vector<TokenId> eog;
  std::shared_ptr<const TokenTrie> token_trie;  // built on the first grammar request

  std::shared_ptr<ThreadPool> pool;  // EngineConfig::pool, or the engine's own
  std::unique_ptr<KvStorage> storage;
  std::unique_ptr<KvStorage> draft_storage;  // draft model's pool (same block ids)
  std::unique_ptr<TieredKvStore> tiers;       // lower prefix-cache tiers (null: off); kv points at it
  std::unique_ptr<KvCacheManager> kv;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<Runner> runner;

  // An embed() call: its inputs, computed in order over one or more steps.
  struct EmbedJob {
    std::shared_ptr<EmbedHandle> handle;
    std::vector<std::vector<TokenId>> inputs;
    size_t next = 0;  // inputs [0, next) are done
  };
  std::unique_ptr<EmbedForward> embedder;  // null when the model does not embed
  // Tokens one embedding input may have: the context (encoders with absolute
  // positions: at most their trained positions).
  int64_t max_embed_len() const {
    const ModelConfig& mc = model->config();
    return mc.encoder && mc.enc.abs_pos ? std::min<int64_t>(cfg.max_model_len, mc.n_ctx_train) : cfg.max_model_len;
  }
  std::deque<EmbedJob> embed_queue;        // loop-owned

  // Inbox (any thread -> loop).
  std::mutex inbox_mu;
  std::condition_variable inbox_cv;
  std::vector<std::unique_ptr<RequestState>> inbox;
  std::vector<EmbedJob> embed_inbox;
  std::vector<std::function<void()>> ops;  // run on the loop thread between steps (Engine::prefix_op)
  std::vector<uint64_t> cancels;
  bool stopping = false;
  std::atomic<uint64_t> next_request_id{1};
  // Stepping control (Engine::pause), under inbox_mu: a pause is requested,
  // the loop may still run steps_allowed iterations, the loop is parked.
  bool pause_requested = false;
  int steps_allowed = 0;
  bool parked = false;
  std::condition_variable parked_cv;

  // Loop-owned.
  std::map<uint64_t, std::unique_ptr<RequestState>> requests;
  std::map<SeqId, SeqState> seqs;
  SeqId next_seq = 1;
  std::vector<float> verify_scratch;
  double waste_sum = 0;
  int64_t waste_steps = 0;
  int64_t moe_passes_seen = 0, expert_reads_seen = 0;  // the runner's counters at the last step's end

  mutable std::mutex stats_mu;
  EngineStats stats;

  std::thread loop_thread;

  Impl(std::shared_ptr<const Model> m, Tokenizer t, EngineConfig c) : model(std::move(m)), tok(std::move(t)), cfg(c) {}

  // What one step produced, gathered by after_step's phases.
  struct StepResult {
    std::vector<SeqAdvance> advances;
    std::vector<size_t> first_row;          // per advance: the logits row of its first token
    std::vector<RequestState*> searching;   // search requests that got rows in this step
    std::vector<SeqId> scored;              // score-only seqs whose prompt is done (nothing to sample)
    std::vector<std::pair<RequestStream*, OutputEvent>> events;
    std::vector<uint64_t> search_closed;
    int64_t prefill_computed = 0, generated = 0, closed = 0;
    int64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted = 0;
  };
  // The forward pass's outputs, reused from step to step.
  struct StepBuffers {
    std::vector<float> logits, hidden;
    std::vector<std::vector<TokenId>> drafts;
    std::vector<const LoraAdapter*> loras;  // per scheduled seq (mark_wanted_rows); empty: none
  };

  // The loop (engine_loop.cpp): wait, take the inbox, schedule, run a step.
  void loop();
  bool wait_for_work();
  void wait_when_blocked();
  void run_step(SchedulerOutput& out, StepBuffers& buf);
  bool mark_wanted_rows(SchedulerOutput& out, std::vector<const LoraAdapter*>* loras);
  void score_prompt_rows(RequestState& rs, const ScheduledSeq& s, const float* rows);
  void attach_prompt_logprobs(RequestState& rs, OutputEvent& ev);
  void fail_batch(const SchedulerOutput& out, const Status& st);
  void fail_open_requests();
  // after_step's phases, in order.
  void drop_preempted_search_rows(const SchedulerOutput& out);
  void read_rows(const SchedulerOutput& out, std::span<const std::vector<TokenId>> drafts,
                 const std::vector<float>& logits, const std::vector<float>& hidden, StepResult* step);
  void fork_samples(const std::vector<float>& logits, StepResult* step);
  void make_step_events(const std::vector<float>& logits, int64_t time_ns, StepResult* step);
  void account_step(const SchedulerOutput& out, const StepResult& step, int64_t step_start_ns, int64_t step_end_ns);
  void deliver(StepResult& step);
  void drain_inbox();
  // Runs the queued embedding inputs (whole inputs, up to a step's token
  // budget, at least one) and completes the calls they finish.
  void run_embed_step();
  void admit(std::unique_ptr<RequestState> rs);
  void fail_request(RequestState& rs, const Status& st);
  void finish_seq(SeqId id, FinishReason reason);
  void close_request_if_done(RequestState& rs);
  SeqState make_seq_state(RequestState* rs, int32_t index, const SamplingParams& p);
  Status propose(const SchedulerOutput& out, std::vector<std::vector<TokenId>>* drafts);
  SeqAdvance verify(const ScheduledSeq& s, std::span<const TokenId> draft, const float* rows);
  void after_step(const SchedulerOutput& out, std::span<const std::vector<TokenId>> drafts,
                  const std::vector<float>& logits, const std::vector<float>& hidden, int64_t step_start_ns);
  void record_step_timing(const SchedulerOutput& out, int64_t step_start_ns, int64_t step_end_ns);
  void publish_stats();
  TokenId sample_seq(SeqState& ss, std::span<const float> logits, std::span<const TokenId> history);
  OutputEvent make_event(SeqState& ss, std::span<const TokenId> tokens, const float* logits_rows, int64_t time_ns,
                         FinishReason final_reason = FinishReason::none);
  // Search decoding (search_decoding.h).
  void search_chunk(RequestState& rs, const ScheduledSeq& s, const float* logits_row, const float* hidden_rows);
  void search_step(RequestState& rs, int64_t time_ns, std::vector<std::pair<RequestStream*, OutputEvent>>* events,
                   std::vector<uint64_t>* closed);
  void apply_plan(RequestState& rs, const SearchPlan& plan);
  void contrastive_expand(RequestState& rs, SeqId from);
  void requeue_stalled_search();

  static RequestTiming timing_of(const SeqState& ss, int64_t finished_ns) {
    RequestTiming t;
    t.arrival_ns = ss.req->arrival_ns;
    t.scheduled_ns = ss.req->scheduled_ns;
    t.first_token_ns = ss.first_token_ns;
    t.finished_ns = finished_ns;
    t.prefill_chunks = ss.req->prefill_chunks;
    t.detokenize_ns = ss.detokenize_ns;
    t.compute_s = ss.compute_s;
    return t;
  }
};

}  // namespace serval
