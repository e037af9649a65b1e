// The engine's public API (serval/engine.h): creating it, submitting and
// cancelling requests, stepping control, stats. The loop and its phases are
// in engine_loop.cpp.
#include "engine/engine_impl.h"

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <random>
#include <string>

#include "engine/ngram_draft.h"
#include "engine/token_trie_for.h"

namespace serval {

using engine_detail::now_ns;

// ---------------------------------------------------------------------------
// RequestStream

void RequestStream::push(OutputEvent ev) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(ev));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

void RequestStream::set_notify(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  notify_ = std::move(fn);
}

bool RequestStream::next_for(OutputEvent* ev, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  auto ready = [&] { return !q_.empty() || open_samples_ <= 0 || failed_; };
  if (timeout_ms < 0) cv_.wait(lk, ready);
  else if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), ready)) return false;
  if (q_.empty()) return false;
  *ev = std::move(q_.front());
  q_.pop_front();
  if (!ev->error.ok()) failed_ = true;
  else if (ev->finish != FinishReason::none) --open_samples_;
  return true;
}

bool RequestStream::next(OutputEvent* ev) { return next_for(ev, -1); }

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return q_.empty() && (open_samples_ <= 0 || failed_);
}

// ---------------------------------------------------------------------------
// EmbedHandle

bool EmbedHandle::wait(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout_ms < 0) {
    cv_.wait(lk, [&] { return done_; });
    return true;
  }
  return cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return done_; });
}

bool EmbedHandle::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

void EmbedHandle::set_notify(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!done_) {
      notify_ = std::move(fn);
      return;
    }
  }
  if (fn) fn();
}

void EmbedHandle::finish() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    fn = std::move(notify_);
  }
  cv_.notify_all();
  if (fn) fn();
}

// ---------------------------------------------------------------------------
// parse_kv_memory

Expected<size_t> parse_kv_memory(const std::string& text) {
  const auto bad = [&] {
    return invalid_argument("--kv-memory: expected bytes (e.g. 512M, 2G) or a fraction of free RAM in (0, 1), got '" +
                            text + "'");
  };
  if (text.empty() || text.size() > 32) return bad();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return bad();
  }
  if (!std::isfinite(v) || v <= 0) return bad();
  const std::string suffix = text.substr(used);
  if (text.find('.') != std::string::npos && suffix.empty()) {
    if (v >= 1.0) return bad();
    std::ifstream in("/proc/meminfo");
    std::string key;
    size_t kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit)
      if (key == "MemAvailable:") return (size_t)(v * (double)kb * 1024.0);
    return invalid_argument("--kv-memory: cannot read MemAvailable from /proc/meminfo for a fraction");
  }
  double mult = 1;
  if (suffix == "" || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB") mult = 1024.0;
  else if (suffix == "M" || suffix == "MiB") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else return bad();
  const double bytes = v * mult;
  if (bytes > 1e15) return bad();
  return (size_t)bytes;
}

// ---------------------------------------------------------------------------
// Engine

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    impl_->stopping = true;
  }
  impl_->inbox_cv.notify_all();
  impl_->parked_cv.notify_all();
  if (impl_->loop_thread.joinable()) impl_->loop_thread.join();
  // A persistent tier keeps what the pool and the RAM tier hold, so that the
  // next start finds it (the loop has stopped: this thread owns the cache).
  if (impl_->tiers && impl_->tiers->has_disk()) {
    impl_->tiers->begin_persist();
    impl_->kv->flush_to_tier();
    impl_->tiers->persist();
  }
}

void Engine::prefix_op(PrefixOp op, std::vector<TokenId> tokens, uint64_t tenant_salt,
                       std::function<void(Expected<int64_t>)> done) {
  Impl* im = impl_.get();
  if (!im->tiers || !im->tiers->has_disk())
    return done(invalid_argument("saved prefixes need the disk tier of the KV cache (--kv-cache-dir)"));
  for (TokenId t : tokens)
    if (t < 0 || t >= im->tok.n_vocab()) return done(invalid_argument("token id " + std::to_string(t) + " out of range"));
  auto fn = [im, op, tokens = std::move(tokens), tenant_salt, done] {
    const PrefixKey key{tenant_salt, 0};
    if (op == PrefixOp::restore) {
      const int64_t n = im->kv->restore_prefix(tokens, key);
      im->publish_stats();  // stats() already show it when the caller hears back
      return done(n);
    }
    const int64_t n = im->kv->pin_prefix(tokens, key, op == PrefixOp::pin);
    im->publish_stats();
    if (n < 0)
      return done(Status(StatusCode::resource_exhausted,
                         "the disk tier's budget is full of saved prefixes (--kv-cache-disk); delete some"));
    done(n);
  };
  {
    std::lock_guard<std::mutex> lk(im->inbox_mu);
    if (!im->stopping) {
      im->ops.push_back(std::move(fn));
      im->inbox_cv.notify_all();
      return;
    }
  }
  done(Status(StatusCode::resource_exhausted, "engine shutting down"));
}

void Engine::pause() {
  std::unique_lock<std::mutex> lk(impl_->inbox_mu);
  impl_->pause_requested = true;
  impl_->inbox_cv.notify_all();  // an idle loop wakes to park
  impl_->parked_cv.wait(lk, [&] { return impl_->parked || impl_->stopping; });
}

void Engine::resume() {
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    impl_->pause_requested = false;
    impl_->steps_allowed = 0;
    impl_->parked = false;
  }
  impl_->inbox_cv.notify_all();
}

void Engine::step(int n) {
  std::unique_lock<std::mutex> lk(impl_->inbox_mu);
  if (!impl_->pause_requested || n <= 0) return;
  impl_->steps_allowed = n;
  impl_->parked = false;
  impl_->inbox_cv.notify_all();
  impl_->parked_cv.wait(lk, [&] { return impl_->parked || impl_->stopping; });
}

bool Engine::paused() const {
  std::lock_guard<std::mutex> lk(impl_->inbox_mu);
  return impl_->pause_requested;
}

namespace {

// Speculation settings in range; a draft model with exactly the target's vocabulary.
Status check_spec_config(const SpecConfig& sp, const Model& target, const Tokenizer& tok) {
  if (sp.mode == SpecConfig::Mode::none) return {};
  const auto range = [](const char* name, int32_t v, int32_t lo, int32_t hi) -> Status {
    if (v >= lo && v <= hi) return {};
    return invalid_argument(std::string(name) + ": expected " + std::to_string(lo) + ".." + std::to_string(hi) +
                            ", got " + std::to_string(v));
  };
  SERVAL_RETURN_IF_ERROR(range("--draft-max", sp.draft_max, 1, Scheduler::kMaxDraft));
  SERVAL_RETURN_IF_ERROR(range("--draft-min", sp.draft_min, 0, sp.draft_max));
  if (sp.mode == SpecConfig::Mode::ngram) {
    SERVAL_RETURN_IF_ERROR(range("--ngram-max", sp.ngram_max, 1, 64));
    return range("--ngram-min", sp.ngram_min, 1, sp.ngram_max);
  }
  if (!sp.draft_model) return invalid_argument("speculative decoding with a draft model: no draft model given");
  const ModelConfig& dc = sp.draft_model->config();
  if (dc.n_vocab != target.config().n_vocab)
    return invalid_argument("draft model: vocabulary of " + std::to_string(dc.n_vocab) +
                            " tokens, the target's has " + std::to_string(target.config().n_vocab));
  auto dt = Tokenizer::from_gguf(sp.draft_model->file());
  if (!dt.ok()) return dt.status().with_context("draft model tokenizer");
  if (dt->n_vocab() != tok.n_vocab())
    return invalid_argument("draft model: tokenizer has " + std::to_string(dt->n_vocab()) + " tokens, the target's " +
                            std::to_string(tok.n_vocab()));
  for (TokenId t = 0; t < tok.n_vocab(); ++t) {
    const std::string a = dt->token_to_piece(t, true), b = tok.token_to_piece(t, true);
    if (a != b)
      return invalid_argument("draft model: vocabulary differs from the target's at token " + std::to_string(t) +
                              " ('" + a + "' vs '" + b + "')");
  }
  return {};
}

// What names a model's KV for the disk tier across restarts, without reading
// the whole file: its size, every metadata key and (abridged) value, every
// tensor's name, type, shape and offset, and 3 x 256 bytes of each tensor's
// data (start, middle, end; a fine-tune changes them). Pages released after
// packing are read back from the file.
Hash128 model_identity(const gguf::GgufFile& f) {
  std::string buf = std::to_string(f.file_size()) + '/' + std::to_string(f.data_offset()) + '\n';
  for (const gguf::KeyValue& kv : f.metadata()) buf += kv.key + '=' + gguf::value_to_string(kv.value) + '\n';
  for (const gguf::TensorInfo& t : f.tensors()) {
    buf += t.name + ':' + std::to_string((int)t.type) + ':' + std::to_string(t.offset);
    for (int64_t d : t.dims) buf += ',' + std::to_string(d);
    const auto data = f.tensor_data(t);
    const size_t n = std::min<size_t>(256, data.size());
    for (size_t at : {size_t{0}, (data.size() - n) / 2, data.size() - n})
      buf.append(reinterpret_cast<const char*>(data.data() + at), n);
  }
  return siphash128(buf.data(), buf.size(), 0x6d6f64656c2d6964ull, 0x656e746974790001ull);
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const Model> model, const Tokenizer& tok,
                                                 EngineConfig cfg) {
  const ModelConfig& mc = model->config();
  if (cfg.block_size < 1 || cfg.block_size > 1024)
    return invalid_argument("block size: expected 1..1024, got " + std::to_string(cfg.block_size));
  if (cfg.max_batch_tokens < 1) return invalid_argument("max batch tokens must be >= 1");
  if (cfg.max_seqs < 1) return invalid_argument("max seqs must be >= 1");
  if (cfg.max_model_len <= 0) cfg.max_model_len = std::min<int64_t>(mc.n_ctx_train, 4096);
  if (tok.n_vocab() != mc.n_vocab)
    return invalid_argument("tokenizer has " + std::to_string(tok.n_vocab()) + " tokens, the model " +
                            std::to_string(mc.n_vocab));
  SERVAL_RETURN_IF_ERROR(check_spec_config(cfg.spec, *model, tok));
  auto impl = std::make_unique<Impl>(std::move(model), tok, cfg);
  const Model& m = *impl->model;
  const Model* draft = cfg.spec.mode == SpecConfig::Mode::draft_model ? cfg.spec.draft_model.get() : nullptr;
  if (std::string why = kv_type_check(cfg.kv_type, mc.head_dim); !why.empty()) return invalid_argument(why);
  if (draft)
    if (std::string why = kv_type_check(cfg.kv_type, draft->config().head_dim); !why.empty())
      return invalid_argument("draft model: " + why);
  KvGeometry g{(int32_t)mc.n_layers, (int32_t)mc.kv_dim(), cfg.block_size, cfg.kv_type};
  KvGeometry dg{draft ? (int32_t)draft->config().n_layers : 0, draft ? (int32_t)draft->config().kv_dim() : 0,
                cfg.block_size, cfg.kv_type};
  // Sliding-window layers get a pool of their own, unless the window covers
  // the whole context anyway (nothing to free) or swa_full asks otherwise.
  const int64_t window = mc.sliding_window;
  if (mc.has_swa() && !cfg.swa_full && window < cfg.max_model_len) g.swa_layers = mc.layer_swa;
  const bool swa = g.n_swa_layers() > 0;
  // The draft's pool mirrors the target's block ids: --kv-memory pays for both.
  const size_t bpb = g.bytes_per_main_block() + (draft ? dg.bytes_per_block() : 0);
  const size_t bpb_swa = g.bytes_per_swa_block();
  auto blocks_for = [&](int64_t n) { return (n + cfg.block_size - 1) / cfg.block_size; };
  int64_t n_swa_blocks = 0;
  if (swa) {
    // Each running sequence holds its window (plus the block being filled
    // and one boundary); a step's prefill chunks hold their tokens on top,
    // until the next step releases what they slid past. A quarter more keeps
    // recent windows for prefix-cache hits. At most half the memory, never
    // more blocks than the main pool, and at least one sequence's worst step.
    const int64_t per_seq = blocks_for(window - 1) + 2;
    const int64_t want = (cfg.max_seqs * per_seq + blocks_for(cfg.max_batch_tokens) + cfg.max_seqs) * 5 / 4;
    const int64_t least = blocks_for(cfg.max_batch_tokens + window) + 2;
    const int64_t half = (int64_t)(cfg.kv_memory_bytes / 2 / bpb_swa);
    n_swa_blocks = std::max(least, std::min(want, half));
    const int64_t rest = (int64_t)cfg.kv_memory_bytes - n_swa_blocks * (int64_t)bpb_swa;
    const int64_t n_main = rest > 0 ? rest / (int64_t)bpb : 0;
    if (n_main < n_swa_blocks) n_swa_blocks = std::max<int64_t>(1, (int64_t)(cfg.kv_memory_bytes / (bpb + bpb_swa)));
  }
  // Encoders never generate: their pool is a single block the loop never uses.
  const int64_t n_blocks =
      mc.encoder ? 1 : (int64_t)((cfg.kv_memory_bytes - (size_t)n_swa_blocks * bpb_swa) / bpb);
  const int64_t n_host = swa ? 0 : (int64_t)(cfg.swap_memory_bytes / bpb);
  if (n_blocks < 1)
    return invalid_argument("--kv-memory " + std::to_string(cfg.kv_memory_bytes) +
                            " bytes holds no KV block (one block takes " + std::to_string(bpb + bpb_swa) + ")");
  if (n_blocks > (1 << 30) || n_host > (1 << 30) || n_swa_blocks > (1 << 30))
    return invalid_argument("KV memory is too large");
  auto storage = KvStorage::create(g, (int32_t)n_blocks, (int32_t)n_host, (int32_t)n_swa_blocks);
  if (!storage.ok()) return storage.status();
  impl->storage = std::make_unique<KvStorage>(std::move(storage.value()));
  if (draft) {
    auto ds = KvStorage::create(dg, (int32_t)n_blocks, (int32_t)n_host);
    if (!ds.ok()) return ds.status();
    impl->draft_storage = std::make_unique<KvStorage>(std::move(ds.value()));
  }
  impl->pool = cfg.pool ? cfg.pool
                        : std::make_shared<ThreadPool>(cfg.n_threads > 0 ? cfg.n_threads : ThreadPool::default_threads());
  KvCacheConfig kc;
  kc.n_blocks = (int32_t)n_blocks;
  kc.block_size = cfg.block_size;
  kc.enable_prefix_caching = cfg.enable_prefix_caching;
  kc.n_host_blocks = (int32_t)n_host;
  kc.n_swa_blocks = (int32_t)n_swa_blocks;
  kc.swa_window = swa ? (int32_t)window : 0;
  // A random hash key per process, so no tenant can aim for collisions (hits
  // are verified exactly anyway; this just keeps the map well spread).
  std::random_device rd;
  kc.hash_k0 = ((uint64_t)rd() << 32) ^ rd();
  kc.hash_k1 = ((uint64_t)rd() << 32) ^ rd();
  if (cfg.kv_cache_ram_bytes > 0 || !cfg.kv_cache_dir.empty()) {
    if (mc.encoder) return invalid_argument("KV cache tiers: an encoder keeps no KV cache");
    if (!cfg.enable_prefix_caching) return invalid_argument("KV cache tiers need prefix caching");
    if (swa)
      return invalid_argument("KV cache tiers: not with a sliding-window KV pool (the model has sliding-window "
                              "layers; --swa-full keeps whole-context KV for them)");
    std::vector<KvStorage*> st = {impl->storage.get()};
    if (impl->draft_storage) st.push_back(impl->draft_storage.get());
    Hash128 id = model_identity(m.file());
    if (draft) {
      const Hash128 d = model_identity(draft->file());
      id = siphash128(&d, sizeof d, id.lo, id.hi);
    }
    KvTierConfig tc;
    tc.ram_bytes = cfg.kv_cache_ram_bytes;
    tc.disk_dir = cfg.kv_cache_dir;
    tc.disk_bytes = cfg.kv_cache_disk_bytes;
    tc.identity = tier_identity(id, {st.begin(), st.end()});
    auto tiers = TieredKvStore::create(tc, st);
    if (!tiers.ok()) return tiers.status();
    impl->tiers = std::move(tiers.value());
    if (DiskTier* d = impl->tiers->disk()) {  // chain hashes must survive restarts: the directory's key
      kc.hash_k0 = d->hash_k0();
      kc.hash_k1 = d->hash_k1();
    }
  }
  impl->kv = std::make_unique<KvCacheManager>(kc);
  if (impl->tiers) impl->kv->set_tier(impl->tiers.get());
  SchedulerConfig sc;
  sc.max_batch_tokens = cfg.max_batch_tokens;
  sc.max_seqs = cfg.max_seqs;
  sc.max_model_len = cfg.max_model_len;
  sc.enable_chunked_prefill = cfg.enable_chunked_prefill;
  sc.preemption = n_host > 0 ? SchedulerConfig::Preemption::swap : SchedulerConfig::Preemption::recompute;
  sc.aging_per_step = cfg.aging_per_step;
  sc.background_priority = cfg.background_priority;
  sc.background_prefill_tokens = cfg.background_prefill_tokens;
  if (cfg.spec.mode != SpecConfig::Mode::none) {
    sc.draft_max = cfg.spec.draft_max;
    sc.draft_min = cfg.spec.draft_min;
    sc.track_draft_kv = cfg.spec.mode == SpecConfig::Mode::draft_model;
  }
  SERVAL_RETURN_IF_ERROR(Scheduler::validate(sc));
  impl->sched = std::make_unique<Scheduler>(sc, impl->kv.get());
  impl->runner = std::make_unique<Runner>(m, *impl->storage, impl->pool.get(), draft, impl->draft_storage.get());
  if (mc.tp.size > 1) {
    // Every rank mirrors the pool and each step's copies and batch; what
    // else moves KV bytes (swaps, tiers, a second pool) is not mirrored yet.
    const char* why = !cfg.tp                                    ? "it needs the link to the other ranks"
                      : draft                                     ? "a draft model is not split"
                      : n_host > 0                                ? "swap space (--swap-memory) is not mirrored"
                      : cfg.kv_cache_ram_bytes || !cfg.kv_cache_dir.empty() ? "KV tiers are not mirrored"
                      : swa                                       ? "a sliding-window pool is not mirrored (--swa-full)"
                      : cfg.pooling != Pooling::none              ? "embeddings need the whole model"
                                                                  : nullptr;
    if (why)
      return invalid_argument("tensor parallelism (rank " + std::to_string(mc.tp.rank) + " of " +
                              std::to_string(mc.tp.size) + "): " + why);
    SERVAL_RETURN_IF_ERROR(cfg.tp->send_pool((int32_t)n_blocks, cfg.block_size, cfg.kv_type));
    impl->runner->set_tensor_parallel(cfg.tp);
  }
  if (cfg.pooling != Pooling::none && mc.encoder && cfg.pooling != mc.pooling)
    return invalid_argument(std::string("--pooling ") + pooling_name(cfg.pooling) + ": the encoder's pooling is " +
                            pooling_name(mc.pooling) + " (set by the file)");
  if (cfg.pooling == Pooling::rank && !mc.encoder)
    return invalid_argument("--pooling rank: only encoders with a classification head rank");
  if (cfg.max_embed_inputs < 1) return invalid_argument("max embed inputs must be >= 1");
  if ((cfg.pooling != Pooling::none ? cfg.pooling : mc.pooling) != Pooling::none)
    impl->embedder = std::make_unique<EmbedForward>(m, impl->pool.get(), cfg.pooling, cfg.kv_type);
  for (TokenId t = 0; t < impl->tok.n_vocab(); ++t)
    if (impl->tok.is_eog(t)) impl->eog.push_back(t);
  impl->stats.kv_blocks_total = (int32_t)n_blocks;
  if (impl->tiers) impl->stats.kv_tiers = impl->tiers->stats();
  impl->stats.kv_swa_blocks_total = (int32_t)n_swa_blocks;
  impl->stats.kv_bytes_per_block = bpb;
  impl->stats.kv_swa_bytes_per_block = bpb_swa;
  Impl* raw = impl.get();
  std::unique_ptr<Engine> e(new Engine(std::move(impl)));
  raw->loop_thread = std::thread([raw] { raw->loop(); });
  return e;
}

// Search decoding within the engine's bounds: the seqs of one request must
// be able to run at once (max_seqs, the KV pool).
Status Engine::check_search_request(const Request& req, int64_t max_total) const {
  const SamplingParams& p = req.params;
  const EngineConfig& cfg = impl_->cfg;
  if (!p.beam_search() && !p.contrastive_search()) return {};
  const int32_t limit = std::min(cfg.max_beam_width, cfg.max_seqs);
  const char* field = p.beam_search() ? "beam_width" : "top_k";
  const int32_t width = p.beam_search() ? p.beam_width : p.top_k;
  if (width > limit)
    return invalid_argument(std::string(field) + ": expected at most " + std::to_string(limit) +
                            " on this server, got " + std::to_string(width));
  if (p.beam_search() && req.n > p.beam_width)
    return invalid_argument("n: expected at most beam_width (" + std::to_string(p.beam_width) + "), got " +
                            std::to_string(req.n));
  if (p.contrastive_search() && req.n != 1)
    return invalid_argument("n: expected 1 with contrastive search, got " + std::to_string(req.n));
  if ((int64_t)req.prompt.size() >= max_total)
    return invalid_argument("prompt: " + std::to_string(req.prompt.size()) +
                            " tokens leave no room for contrastive search in the context of " +
                            std::to_string(cfg.max_model_len) + " tokens");
  const int64_t blocks = impl_->kv->blocks_for(max_total) * width;
  if (blocks > impl_->kv->n_blocks())
    return invalid_argument(std::string(field) + ": " + std::to_string(width) + " sequences of up to " +
                            std::to_string(max_total) + " tokens need " + std::to_string(blocks) +
                            " KV blocks, the pool has " + std::to_string(impl_->kv->n_blocks()));
  return {};
}

namespace {

// A file's size and modification time, to tell a file replaced on disk.
std::string file_stamp(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const auto t = std::filesystem::last_write_time(path, ec);
  return std::to_string(size) + "@" + std::to_string(t.time_since_epoch().count());
}

}  // namespace

Expected<std::shared_ptr<RequestStream>> Engine::submit(Request req) {
  const ModelConfig& mc = impl_->model->config();
  const EngineConfig& cfg = impl_->cfg;
  if (mc.encoder)
    return invalid_argument("model: '" + info().model_name + "' is an embedding model (" + mc.arch +
                            "): it does not generate text (use /v1/embeddings" +
                            (mc.pooling == Pooling::rank ? std::string(" or /v1/rerank") : std::string()) + ")");
  if (req.prompt.empty()) return invalid_argument("prompt: must not be empty");
  if ((int64_t)req.prompt.size() >= cfg.max_model_len)
    return invalid_argument("prompt: " + std::to_string(req.prompt.size()) +
                            " tokens leave no room to generate in the context of " +
                            std::to_string(cfg.max_model_len) + " tokens");
  for (TokenId t : req.prompt)
    if (t < 0 || t >= mc.n_vocab)
      return invalid_argument("prompt: token id " + std::to_string(t) + " is out of range [0, " +
                              std::to_string(mc.n_vocab) + ")");
  if (req.n < 1 || req.n > cfg.max_n)
    return invalid_argument("n: expected a value in [1, " + std::to_string(cfg.max_n) + "], got " +
                            std::to_string(req.n));
  // Score only (prompt log-probs, nothing generated): max_tokens 0 is allowed.
  const bool score_only = req.prompt_logprobs >= 0 && req.params.max_tokens && *req.params.max_tokens == 0;
  SERVAL_RETURN_IF_ERROR(req.params.validate((int32_t)mc.n_vocab, score_only));
  if (req.prompt_logprobs >= 0) {
    if (req.prompt_logprobs > SamplingLimits::max_logprobs)
      return invalid_argument("prompt_logprobs: expected a value in [0, " +
                              std::to_string(SamplingLimits::max_logprobs) + "], got " +
                              std::to_string(req.prompt_logprobs));
    if (req.params.beam_search() || req.params.contrastive_search())
      return invalid_argument("prompt_logprobs: not available with beam or contrastive search");
    if (score_only && req.n != 1)
      return invalid_argument("n: expected 1 when only the prompt is scored (max_tokens 0), got " +
                              std::to_string(req.n));
  }
  const int64_t max_new = req.params.max_tokens ? std::max<int64_t>(1, *req.params.max_tokens) : cfg.max_model_len;
  // Contrastive search runs its candidates one position past the output.
  const int64_t context = cfg.max_model_len - (req.params.contrastive_search() ? 1 : 0);
  const int64_t max_total = std::min<int64_t>(context, (int64_t)req.prompt.size() + max_new);
  SERVAL_RETURN_IF_ERROR(check_search_request(req, max_total));
  auto rs = std::make_unique<Impl::RequestState>();
  if (!req.lora.empty()) {
    std::unique_lock<std::mutex> lk(impl_->lora_mu);
    auto it = impl_->loras.find(req.lora);
    if (it == impl_->loras.end()) return not_found("LoRA adapter '" + req.lora + "' is not loaded");
    if (!it->second.adapter) {
      // Dropped from memory (max_loras): read it again, outside the lock.
      const LoraInfo info = it->second.info;
      lk.unlock();
      const std::string stamp = file_stamp(info.path);
      auto a = LoraAdapter::load(info.path, *impl_->model, info.user_scale);
      if (!a.ok()) return a.status().with_context("LoRA adapter '" + req.lora + "'");
      lk.lock();
      it = impl_->loras.find(req.lora);
      if (it == impl_->loras.end() || it->second.info.id != info.id)
        return not_found("LoRA adapter '" + req.lora + "' is not loaded");
      if (!it->second.adapter) {
        it->second.adapter = *a;
        it->second.info.resident = true;
        ++it->second.info.reloads;
        if (stamp != it->second.file_stamp) {  // another file now: its KV must not meet the old one's
          it->second.file_stamp = stamp;
          it->second.info.id = impl_->next_lora_id++;
        }
      }
    }
    it->second.last_used = ++impl_->lora_clock;
    rs->lora = it->second.adapter;
    rs->lora_id = it->second.info.id;
    impl_->trim_loras();
  }
  rs->id = impl_->next_request_id++;
  rs->arrival_ns = now_ns();
  rs->max_total = max_total;
  rs->stream = std::make_shared<RequestStream>(rs->id, req.n);
  rs->req = std::move(req);
  auto stream = rs->stream;
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    if (impl_->stopping) return Status(StatusCode::resource_exhausted, "engine shutting down");
    impl_->inbox.push_back(std::move(rs));
  }
  impl_->inbox_cv.notify_all();
  return stream;
}

Status Engine::load_lora(const std::string& name, const std::string& path, float scale) {
  if (name.empty() || name.size() > 256) return invalid_argument("LoRA name: 1 to 256 characters");
  if (impl_->model->config().encoder) return invalid_argument("LoRA adapters: not for an embedding model");
  {
    std::lock_guard<std::mutex> lk(impl_->lora_mu);
    if (impl_->loras.count(name)) return invalid_argument("LoRA adapter '" + name + "' is loaded already");
    if ((int)impl_->loras.size() >= kMaxLoras)
      return Status(StatusCode::resource_exhausted, "at most " + std::to_string(kMaxLoras) + " LoRA adapters are loaded at once");
  }
  auto a = LoraAdapter::load(path, *impl_->model, scale);  // outside the lock: reads the file
  if (!a.ok()) return a.status();
  std::lock_guard<std::mutex> lk(impl_->lora_mu);
  if (impl_->loras.count(name)) return invalid_argument("LoRA adapter '" + name + "' is loaded already");
  Impl::LoraEntry e;
  e.adapter = *a;
  e.file_stamp = file_stamp(path);
  e.last_used = ++impl_->lora_clock;
  e.info.name = name;
  e.info.path = path;
  e.info.user_scale = scale;
  e.info.scale = (*a)->scale();
  e.info.rank = (*a)->rank();
  e.info.n_matrices = (int64_t)(*a)->n_matrices();
  e.info.bytes = (int64_t)(*a)->bytes();
  e.info.id = impl_->next_lora_id++;
  impl_->loras.emplace(name, std::move(e));
  impl_->trim_loras();
  return {};
}

void Engine::Impl::trim_loras() {
  if (cfg.max_loras <= 0) return;
  for (;;) {
    int resident = 0;
    LoraEntry* victim = nullptr;
    for (auto& [n, e] : loras) {
      if (!e.adapter) continue;
      ++resident;
      // Idle: no request holds it (the registry's reference is the only one).
      if (e.adapter.use_count() == 1 && (!victim || e.last_used < victim->last_used)) victim = &e;
    }
    if (resident <= cfg.max_loras || !victim) return;
    victim->adapter.reset();
    victim->info.resident = false;
  }
}

Status Engine::unload_lora(const std::string& name) {
  std::lock_guard<std::mutex> lk(impl_->lora_mu);
  if (impl_->loras.erase(name) == 0) return not_found("LoRA adapter '" + name + "' is not loaded");
  return {};
}

std::vector<LoraInfo> Engine::loras() const {
  std::lock_guard<std::mutex> lk(impl_->lora_mu);
  std::vector<LoraInfo> out;
  for (const auto& [n, e] : impl_->loras) out.push_back(e.info);
  return out;
}

void Engine::cancel(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    impl_->cancels.push_back(request_id);
  }
  impl_->inbox_cv.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  return impl_->stats;
}

Expected<std::shared_ptr<EmbedHandle>> Engine::embed(EmbedRequest req) {
  const ModelConfig& mc = impl_->model->config();
  const EngineConfig& cfg = impl_->cfg;
  if (!impl_->embedder)
    return invalid_argument("model: '" + info().model_name +
                            "' does not produce embeddings (no pooling type in the file; a server can set one with "
                            "--pooling mean|cls|last)");
  if (req.inputs.empty()) return invalid_argument("input: must not be empty");
  if ((int64_t)req.inputs.size() > cfg.max_embed_inputs)
    return invalid_argument("input: " + std::to_string(req.inputs.size()) + " inputs, at most " +
                            std::to_string(cfg.max_embed_inputs) + " per request");
  const int64_t max_len = impl_->max_embed_len();
  int64_t total = 0;
  for (size_t i = 0; i < req.inputs.size(); ++i) {
    const auto& in = req.inputs[i];
    if (in.empty()) return invalid_argument("input[" + std::to_string(i) + "]: must not be empty");
    if ((int64_t)in.size() > max_len)
      return invalid_argument("input[" + std::to_string(i) + "]: " + std::to_string(in.size()) +
                              " tokens, more than the context of " + std::to_string(max_len));
    for (TokenId t : in)
      if (t < 0 || t >= mc.n_vocab)
        return invalid_argument("input[" + std::to_string(i) + "]: token id " + std::to_string(t) +
                                " is out of range [0, " + std::to_string(mc.n_vocab) + ")");
    total += (int64_t)in.size();
  }
  auto h = std::make_shared<EmbedHandle>();
  h->dim = impl_->embedder->out_dim();
  h->prompt_tokens = total;
  h->data.reserve(req.inputs.size() * (size_t)h->dim);
  {
    std::lock_guard<std::mutex> lk(impl_->inbox_mu);
    if (impl_->stopping) return Status(StatusCode::resource_exhausted, "engine shutting down");
    impl_->embed_inbox.push_back(Impl::EmbedJob{h, std::move(req.inputs), 0});
  }
  impl_->inbox_cv.notify_all();
  return h;
}

EngineInfo Engine::info() const {
  EngineInfo i;
  const auto& f = impl_->model->file();
  auto name = f.get_string("general.name");
  i.model_name = name.ok() && !name->empty() ? *name : std::string("model");
  i.architecture = impl_->model->config().arch;
  i.n_vocab = impl_->model->config().n_vocab;
  i.max_model_len = impl_->cfg.max_model_len;
  if (auto t = f.get_string("tokenizer.chat_template"); t.ok()) i.chat_template = *t;
  i.kv_bytes_per_token = impl_->storage->geometry().bytes_per_token() +
                         (impl_->draft_storage ? impl_->draft_storage->geometry().bytes_per_token() : 0);
  i.generates = !impl_->model->config().encoder;
  i.kernels = BatchForward::kernel_level();
  if (impl_->embedder) {
    i.pooling = impl_->embedder->pooling();
    i.embedding_dim = impl_->embedder->out_dim();
    i.max_embed_len = impl_->max_embed_len();
  }
  return i;
}

const Tokenizer& Engine::tokenizer() const { return impl_->tok; }
const Model& Engine::model() const { return *impl_->model; }
const EngineConfig& Engine::config() const { return impl_->cfg; }

}  // namespace serval

