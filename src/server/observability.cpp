#include "server/observability.h"

#include <chrono>
#include <ctime>

namespace serval::server {

using json = nlohmann::ordered_json;
namespace mt = serval::metrics;

namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t unix_now_s() { return unix_now_ns() / 1'000'000'000; }

// A client's X-Request-Id is kept when it is short and plain; otherwise we make one.
bool plain_id(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s)
    if (!(std::isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.' || c == ':')) return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------
// RequestObservation

RequestObservation::RequestObservation(Observability& o, const http::HttpRequest& req)
    : o_(o), method_(req.method), path_(req.path), remote_(req.remote) {
  start_ns_ = steady_now_ns();
  start_unix_ns_ = unix_now_ns();
  const std::string rid = req.header("x-request-id");
  if (plain_id(rid)) {
    request_id_ = rid;
  } else {
    const auto r = tracing::random_span_id();
    request_id_ = "req-" + tracing::hex(r);
  }
  span_id_ = tracing::random_span_id();
  if (auto tc = tracing::parse_traceparent(req.header("traceparent"))) {
    trace_id_ = tc->trace_id;
    parent_ = tc->span_id;
    sampled_ = tc->sampled();
  } else {
    // New traces for API calls; probes and scrapes only when a caller asks.
    trace_id_ = tracing::random_trace_id();
    sampled_ = path_ != "/metrics" && path_ != "/health" && path_ != "/ready";
  }
  sampled_ = sampled_ && o_.tracing();
}

void RequestObservation::set_tenant(std::string tenant) {
  std::lock_guard<std::mutex> lk(mu_);
  tenant_ = std::move(tenant);
}

void RequestObservation::set_generation(bool stream) {
  std::lock_guard<std::mutex> lk(mu_);
  generation_ = true;
  stream_ = stream;
}

void RequestObservation::on_event(size_t stream_idx, size_t choice_idx, const OutputEvent& ev) {
  std::lock_guard<std::mutex> lk(mu_);
  if (finished_ || !ev.error.ok()) return;
  if (choices_.size() <= choice_idx) choices_.resize(choice_idx + 1);
  ChoiceState& c = choices_[choice_idx];
  const int64_t n = (int64_t)ev.tokens.size();
  if (n > 0 && ev.time_ns > 0) {
    if (!ttft_seen_) {
      ttft_seen_ = true;
      const double ttft = (double)(ev.time_ns - start_ns_) * 1e-9;
      o_.ttft_->observe(ttft);
      if (o_.slo_ttft_) o_.slo_ttft_->record(ttft <= o_.slo_ttft_->threshold_s(), unix_now_s());
    }
    if (c.last_token_ns > 0) {
      // One interval per token: an event carrying k tokens spreads its gap over them.
      const double itl = (double)(ev.time_ns - c.last_token_ns) * 1e-9 / (double)n;
      for (int64_t i = 0; i < n; ++i) o_.itl_->observe(itl);
      if (o_.slo_itl_) o_.slo_itl_->record_n(itl <= o_.slo_itl_->threshold_s() ? n : 0, n, unix_now_s());
    }
    c.last_token_ns = ev.time_ns;
  }
  c.tokens += n;
  completion_tokens_ += n;
  if (ev.finish == FinishReason::none) return;
  o_.finish_f_.with({{"model", o_.cfg_.model_name}, {"finish_reason", finish_reason_name(ev.finish)}}).inc();
  const RequestTiming& t = ev.timing;
  const bool first_sample = ev.index == 0;
  if (first_sample) {
    prompt_tokens_ += ev.prompt_tokens;
    if (t.scheduled_ns > 0 && t.arrival_ns > 0) o_.queue_->observe((double)(t.scheduled_ns - t.arrival_ns) * 1e-9);
    if (t.first_token_ns > 0 && t.scheduled_ns > 0)
      o_.prefill_->observe((double)(t.first_token_ns - t.scheduled_ns) * 1e-9);
  }
  if (t.finished_ns > 0 && t.first_token_ns > 0) o_.decode_->observe((double)(t.finished_ns - t.first_token_ns) * 1e-9);
  compute_s_ += t.compute_s;
  if (sampled_) add_engine_spans(ev, first_sample);
  (void)stream_idx;
}

// queue -> prefill chunk(s) -> decode, and the detokenizer's time, as children
// of the HTTP span. Runs once per finished sample; the request-level spans
// (queue, prefill) come with its first sample.
void RequestObservation::add_engine_spans(const OutputEvent& ev, bool first_sample) {
  const RequestTiming& t = ev.timing;
  auto span = [&](const char* name, int64_t start_ns, int64_t end_ns) -> tracing::Span& {
    tracing::Span s;
    s.name = name;
    s.trace_id = trace_id_;
    s.span_id = tracing::random_span_id();
    s.parent = span_id_;
    s.start_unix_ns = o_.unix_ns(start_ns);
    s.end_unix_ns = o_.unix_ns(std::max(start_ns, end_ns));
    s.attributes.push_back({"serval.sample.index", (int64_t)ev.index});
    spans_.push_back(std::move(s));
    return spans_.back();
  };
  if (first_sample) {
    if (t.arrival_ns > 0 && t.scheduled_ns > 0) span("queue", t.arrival_ns, t.scheduled_ns);
    for (size_t i = 0; i < t.prefill_chunks.size(); ++i) {
      auto& s = span("prefill", t.prefill_chunks[i].start_ns, t.prefill_chunks[i].end_ns);
      s.attributes.push_back({"serval.prefill.chunk", (int64_t)i});
      s.attributes.push_back({"serval.prefill.tokens", t.prefill_chunks[i].n_tokens});
    }
  }
  if (t.first_token_ns > 0 && t.finished_ns > 0) {
    auto& d = span("decode", t.first_token_ns, t.finished_ns);
    d.attributes.push_back({"gen_ai.usage.output_tokens", ev.completion_tokens});
    d.attributes.push_back({"gen_ai.response.finish_reasons", std::string(finish_reason_name(ev.finish))});
    // Detokenization interleaves with decoding (a few microseconds per token):
    // one span of its summed time, starting with the first token.
    auto& k = span("detokenize", t.first_token_ns, t.first_token_ns + t.detokenize_ns);
    k.attributes.push_back({"serval.detokenize.cumulative", true});
  }
}

RequestObservation::Progress RequestObservation::progress() const {
  std::lock_guard<std::mutex> lk(mu_);
  Progress p;
  p.request_id = request_id_;
  p.tenant = tenant_;
  p.age_s = (double)(steady_now_ns() - start_ns_) * 1e-9;
  p.first_token = ttft_seen_;
  p.stream = stream_;
  p.prompt_tokens = prompt_tokens_;
  p.completion_tokens = completion_tokens_;
  return p;
}

double RequestObservation::energy_joules() const {
  return o_.energy_ && o_.energy_->enabled() ? o_.energy_->joules(compute_s_, o_.engine_busy_s_.load()) : 0.0;
}

json RequestObservation::usage_extension() const {
  std::lock_guard<std::mutex> lk(mu_);
  json j = json::object();
  if (o_.cfg_.prices) j["cost_usd"] = o_.cfg_.prices->cost(o_.cfg_.model_name, prompt_tokens_, completion_tokens_);
  if (o_.energy_ && o_.energy_->enabled()) {
    const double e = energy_joules();
    j["energy_joules"] = e;
    if (o_.cfg_.energy.grid_g_per_kwh > 0) j["carbon_grams"] = o_.energy_->carbon_grams(e);
  }
  return j;
}

void RequestObservation::finish(int status, bool client_gone) {
  std::unique_lock<std::mutex> lk(mu_);
  if (finished_) return;
  finished_ = true;
  const int64_t end_ns = steady_now_ns();
  const double duration = (double)(end_ns - start_ns_) * 1e-9;
  if (status > 0) o_.status_f_.with({{"model", o_.cfg_.model_name}, {"code", std::to_string(status)}}).inc();
  if (generation_) {
    // Availability: answered without a server error. Requests the client gave
    // up on are not the server's to count.
    if (o_.slo_avail_ && !client_gone && status > 0) o_.slo_avail_->record(status < 500, unix_now_s());
    if (status == 200 && !client_gone) {
      o_.e2e_->observe(duration);
      o_.prompt_len_->observe((double)prompt_tokens_);
      o_.gen_len_->observe((double)completion_tokens_);
    }
    o_.tenant_counter(o_.tenant_requests_f_, tenant_).inc();
    o_.tenant_counter(o_.tenant_prompt_f_, tenant_).inc((double)prompt_tokens_);
    o_.tenant_counter(o_.tenant_gen_f_, tenant_).inc((double)completion_tokens_);
    if (o_.cfg_.prices)
      o_.tenant_counter(o_.tenant_cost_f_, tenant_).inc(o_.cfg_.prices->cost(o_.cfg_.model_name, prompt_tokens_, completion_tokens_));
    if (o_.energy_ && o_.energy_->enabled()) {
      const double e = energy_joules();
      o_.tenant_counter(o_.tenant_energy_f_, tenant_).inc(e);
      if (o_.cfg_.energy.grid_g_per_kwh > 0) o_.tenant_counter(o_.tenant_carbon_f_, tenant_).inc(o_.energy_->carbon_grams(e));
    }
  }
  if (sampled_) {
    tracing::Span s;
    s.name = method_ + " " + path_;
    s.kind = tracing::SpanKind::server;
    s.trace_id = trace_id_;
    s.span_id = span_id_;
    s.parent = parent_;
    s.start_unix_ns = start_unix_ns_;
    s.end_unix_ns = start_unix_ns_ + (end_ns - start_ns_);
    s.attributes = {{"http.request.method", method_},
                    {"url.path", path_},
                    {"http.response.status_code", (int64_t)status},
                    {"serval.request_id", request_id_},
                    {"serval.tenant", tenant_}};
    if (generation_) {
      s.attributes.push_back({"gen_ai.request.model", o_.cfg_.model_name});
      s.attributes.push_back({"gen_ai.usage.input_tokens", prompt_tokens_});
      s.attributes.push_back({"gen_ai.usage.output_tokens", completion_tokens_});
    }
    if (client_gone) s.attributes.push_back({"serval.client_disconnected", true});
    s.error = status >= 500 || status == 0;
    spans_.push_back(std::move(s));
    o_.exporter_->enqueue(std::move(spans_));
    spans_.clear();
  }
  lk.unlock();
  if (o_.cfg_.log_json) o_.access_log(*this, status, client_gone, duration);
}

// ---------------------------------------------------------------------------
// ObservedChannel: records before the bytes leave, so a client that reads its
// response and then scrapes /metrics sees its request counted.

void ObservedChannel::send(int status, std::string content_type, std::string body, http::Headers extra) {
  obs_->finish(status, inner_->disconnected());
  extra.emplace_back("X-Request-Id", obs_->request_id());
  inner_->send(status, std::move(content_type), std::move(body), std::move(extra));
}

void ObservedChannel::start_stream(int status, std::string content_type, http::Headers extra) {
  stream_status_ = status;
  extra.emplace_back("X-Request-Id", obs_->request_id());
  inner_->start_stream(status, std::move(content_type), std::move(extra));
}

void ObservedChannel::end() {
  obs_->finish(stream_status_.load(), inner_->disconnected());
  inner_->end();
}

// ---------------------------------------------------------------------------
// Observability

Observability::Observability(ObservabilityConfig cfg)
    : cfg_(std::move(cfg)),
      model_{{"model", cfg_.model_name}},
      ttft_f_("serval_time_to_first_token_seconds", "Time from request arrival to its first generated token.",
              mt::latency_buckets()),
      itl_f_("serval_inter_token_latency_seconds", "Time between consecutive tokens of one sample.",
             mt::latency_buckets()),
      e2e_f_("serval_request_duration_seconds", "End-to-end latency of successful generation requests.",
             mt::latency_buckets()),
      queue_f_("serval_request_queue_seconds", "Time from submission to the engine's first step for the request.",
               mt::latency_buckets()),
      prefill_f_("serval_request_prefill_seconds", "Time from the first scheduled step to the first token.",
                 mt::latency_buckets()),
      decode_f_("serval_request_decode_seconds", "Time from a sample's first token to its last.",
                mt::latency_buckets()),
      prompt_len_f_("serval_request_prompt_tokens", "Prompt tokens per successful generation request.",
                    mt::token_buckets()),
      gen_len_f_("serval_request_generation_tokens", "Generated tokens per successful generation request.",
                 mt::token_buckets()),
      finish_f_("serval_request_finished_total", "Finished sequences by finish reason."),
      status_f_("serval_http_responses_total", "HTTP responses by status code."),
      tenant_requests_f_("serval_tenant_requests_total", "Generation requests per tenant (API key)."),
      tenant_prompt_f_("serval_tenant_prompt_tokens_total", "Prompt tokens per tenant."),
      tenant_gen_f_("serval_tenant_generation_tokens_total", "Generated tokens per tenant."),
      tenant_cost_f_("serval_tenant_cost_usd_total", "Cost of the tenant's tokens under the price table, in USD."),
      tenant_energy_f_("serval_tenant_energy_joules_total", "Estimated energy of the tenant's requests."),
      tenant_carbon_f_("serval_tenant_carbon_grams_total", "Estimated emissions of the tenant's requests, g CO2e.") {
  steady_to_unix_ns_ = unix_now_ns() - steady_now_ns();
  ttft_ = &ttft_f_.with(model_);
  itl_ = &itl_f_.with(model_);
  e2e_ = &e2e_f_.with(model_);
  queue_ = &queue_f_.with(model_);
  prefill_ = &prefill_f_.with(model_);
  decode_ = &decode_f_.with(model_);
  prompt_len_ = &prompt_len_f_.with(model_);
  gen_len_ = &gen_len_f_.with(model_);
  auto add_slo = [&](const char* name, double threshold, double objective) {
    slos_.push_back(std::make_unique<SloTracker>(name, threshold, objective));
    return slos_.back().get();
  };
  if (cfg_.slo_ttft_s > 0) slo_ttft_ = add_slo("ttft", cfg_.slo_ttft_s, cfg_.slo_ttft_objective);
  if (cfg_.slo_itl_s > 0) slo_itl_ = add_slo("itl", cfg_.slo_itl_s, cfg_.slo_itl_objective);
  if (cfg_.slo_availability > 0) slo_avail_ = add_slo("availability", 0, cfg_.slo_availability);
  if (cfg_.energy.watts_per_core > 0 || cfg_.energy.use_rapl) energy_ = std::make_unique<EnergyModel>(cfg_.energy);
}

Expected<std::unique_ptr<Observability>> Observability::create(ObservabilityConfig cfg) {
  for (double obj : {cfg.slo_ttft_objective, cfg.slo_itl_objective})
    if (!(obj > 0 && obj < 1)) return invalid_argument("SLO objective must be in (0, 1)");
  if (cfg.slo_availability < 0 || cfg.slo_availability >= 1)
    return invalid_argument("availability objective must be in (0, 1)");
  if (cfg.slo_ttft_s < 0 || cfg.slo_itl_s < 0) return invalid_argument("SLO thresholds must be >= 0");
  std::unique_ptr<Observability> o(new Observability(cfg));
  if (!cfg.otlp_endpoint.empty()) {
    tracing::ExporterConfig ec;
    ec.endpoint = cfg.otlp_endpoint;
    ec.service_name = cfg.service_name;
    auto e = tracing::OtlpExporter::create(ec);
    if (!e.ok()) return e.status();
    o->exporter_ = std::move(e.value());
  }
  return o;
}

std::shared_ptr<RequestObservation> Observability::begin(const http::HttpRequest& req) {
  return std::make_shared<RequestObservation>(*this, req);
}

std::shared_ptr<http::ResponseChannel> Observability::wrap(std::shared_ptr<http::ResponseChannel> ch,
                                                           std::shared_ptr<RequestObservation> obs) {
  return std::make_shared<ObservedChannel>(std::move(ch), std::move(obs));
}

void Observability::access_log(const RequestObservation& r, int status, bool client_gone, double duration_s) const {
  char ts[96];
  const auto now = std::chrono::system_clock::now();
  const std::time_t tt = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  const int ms = (int)(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  json j;
  {
    std::lock_guard<std::mutex> lk(r.mu_);
    j = {{"time", ts},
         {"level", "info"},
         {"msg", "request"},
         {"request_id", r.request_id_},
         {"trace_id", tracing::hex(r.trace_id_)},
         {"span_id", tracing::hex(r.span_id_)},
         {"method", r.method_},
         {"path", r.path_},
         {"status", status},
         {"duration_s", duration_s},
         {"remote", r.remote_},
         {"tenant", r.tenant_}};
    if (r.generation_) {
      j["prompt_tokens"] = r.prompt_tokens_;
      j["completion_tokens"] = r.completion_tokens_;
      j["stream"] = r.stream_;
    }
    if (client_gone) j["client_disconnected"] = true;
  }
  const std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), cfg_.log_out);  // one write: lines do not interleave
  std::fflush(cfg_.log_out);
}

void Observability::write_vllm_aliases(mt::ExpositionWriter& w, const EngineStats& s, int32_t block_size) const {
  using T = mt::Type;
  const std::string m = mt::render_labels({{"model_name", cfg_.model_name}});
  auto one = [&](const char* name, const char* help, double v) {
    w.header(name, help, T::gauge);
    w.sample(name, m, v);
  };
  const double usage = s.kv_blocks_total ? (double)s.kv_blocks_used / s.kv_blocks_total : 0.0;
  one("vllm:num_requests_running", "Requests in the running batch (serval_requests_running).", (double)s.running);
  one("vllm:num_requests_waiting", "Requests waiting to be scheduled (serval_requests_waiting).", (double)s.waiting);
  one("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full (serval_kv_usage_ratio).", usage);
  one("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 = full (serval_kv_usage_ratio; vLLM's older name).", usage);
  w.header("vllm:cache_config_info", "KV-cache configuration (labels).", T::gauge);
  w.sample("vllm:cache_config_info",
           mt::render_labels({{"block_size", std::to_string(block_size)},
                              {"num_gpu_blocks", std::to_string(s.kv_blocks_total)},
                              {"model_name", cfg_.model_name}}),
           1.0);
  // The adapters with requests running / only waiting, comma-separated, and
  // the most held in memory (--max-loras; 0: no bound). The value is the
  // scrape time, as vLLM's (routers take the newest sample).
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& n : v) out += (out.empty() ? "" : ",") + n;
    return out;
  };
  w.header("vllm:lora_requests_info", "LoRA adapters running and waiting (labels).", T::gauge);
  w.sample("vllm:lora_requests_info",
           mt::render_labels({{"max_lora", std::to_string(s.max_loras)},
                              {"running_lora_adapters", join(s.lora_running)},
                              {"waiting_lora_adapters", join(s.lora_waiting)}}),
           std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

void Observability::write_metrics(mt::ExpositionWriter& w, const EngineStats& s, size_t in_flight) const {
  const std::string m = mt::render_labels(model_);
  auto one = [&](const char* name, mt::Type type, const char* help, double v) {
    w.header(name, help, type);
    w.sample(name, m, v);
  };
  using T = mt::Type;
  one("serval_prompt_tokens_total", T::counter, "Prompt tokens of accepted requests.", (double)s.prompt_tokens);
  one("serval_generation_tokens_total", T::counter, "Generated tokens.", (double)s.generated_tokens);
  one("serval_prefill_tokens_computed_total", T::counter, "Prompt tokens run through the model (after prefix hits).",
      (double)s.prefill_tokens_computed);
  one("serval_engine_steps_total", T::counter, "Engine steps (batched forward passes).", (double)s.steps);
  one("serval_embedding_inputs_total", T::counter, "Inputs embedded or scored (embeddings, rerank).",
      (double)s.embed_inputs);
  one("serval_embedding_tokens_total", T::counter, "Tokens of the inputs embedded or scored.", (double)s.embed_tokens);
  one("serval_embedding_busy_seconds_total", T::counter, "Wall time spent in embedding steps.", s.embed_seconds);
  one("serval_engine_busy_seconds_total", T::counter, "Wall time spent in engine steps.", s.step_seconds);
  one("serval_preemptions_total", T::counter, "Sequences preempted for lack of KV blocks.", (double)s.preemptions);
  one("serval_prefix_cache_queries_total", T::counter, "Prompt tokens looked up in the prefix cache.",
      (double)s.prefix_query_tokens);
  one("serval_prefix_cache_hits_total", T::counter, "Prompt tokens served from the prefix cache.",
      (double)s.prefix_hit_tokens);
  one("serval_spec_decode_drafts_total", T::counter, "Speculative decoding draft rounds.", (double)s.spec_drafts);
  one("serval_spec_decode_draft_tokens_total", T::counter, "Tokens proposed by the speculative drafter.",
      (double)s.spec_draft_tokens);
  one("serval_spec_decode_accepted_tokens_total", T::counter, "Draft tokens accepted by the target model.",
      (double)s.spec_accepted_tokens);
  one("serval_requests_running", T::gauge, "Sequences in the running batch.", (double)s.running);
  one("serval_requests_waiting", T::gauge, "Sequences waiting to be scheduled.", (double)s.waiting);
  one("serval_kv_blocks_used", T::gauge, "KV-cache blocks in use.", (double)s.kv_blocks_used);
  one("serval_kv_blocks_capacity", T::gauge, "KV-cache blocks in the pool.", (double)s.kv_blocks_total);
  one("serval_kv_usage_ratio", T::gauge, "Used / total KV-cache blocks.",
      s.kv_blocks_total ? (double)s.kv_blocks_used / s.kv_blocks_total : 0.0);
  one("serval_prefix_cache_blocks", T::gauge, "KV blocks holding prefix-cache entries (in use or reusable).",
      (double)s.prefix_cached_blocks);
  one("serval_http_requests_in_flight", T::gauge, "Generation requests accepted and not finished.", (double)in_flight);
  const KvTierStats& kt = s.kv_tiers;
  if (kt.block_bytes > 0) {  // KV cache tiers on (docs/KV_TIERS.md)
    auto tier = [&](const char* name, mt::Type type, const char* help, double ram, double disk) {
      w.header(name, help, type);
      for (auto [t, v] : {std::pair<const char*, double>{"ram", ram}, {"disk", disk}}) {
        mt::Labels l = model_;
        l.push_back({"tier", t});
        w.sample(name, mt::render_labels(l), v);
      }
    };
    tier("serval_kv_tier_hits_total", T::counter, "Prefix-cache blocks loaded back from a lower KV tier.",
         (double)kt.ram_hits, (double)kt.disk_hits);
    tier("serval_kv_tier_misses_total", T::counter, "Prefix-cache block lookups a lower KV tier did not hold.",
         (double)kt.ram_misses, (double)kt.disk_misses);
    tier("serval_kv_tier_blocks", T::gauge, "KV blocks held by a lower tier.", (double)kt.ram_blocks,
         (double)kt.disk_files);
    tier("serval_kv_tier_bytes", T::gauge, "Bytes held by a lower tier (disk: files, incl. writes in progress).",
         (double)kt.ram_blocks * (double)kt.block_bytes, (double)kt.disk_bytes);
    tier("serval_kv_tier_capacity_bytes", T::gauge, "Budget of a lower KV tier.",
         (double)kt.ram_capacity_blocks * (double)kt.block_bytes, (double)kt.disk_budget_bytes);
    tier("serval_kv_tier_evictions_total", T::counter, "Blocks a lower tier dropped to stay in its budget.",
         (double)kt.ram_evictions, (double)kt.disk_evictions);
    one("serval_kv_tier_stored_bytes_total", T::counter, "KV bytes copied from the pool into the lower tiers.",
        (double)kt.bytes_stored);
    one("serval_kv_tier_loaded_bytes_total", T::counter, "KV bytes promoted from the lower tiers into the pool.",
        (double)kt.bytes_loaded);
    one("serval_kv_tier_promotion_seconds_total", T::counter, "Time spent promoting blocks into the pool.",
        kt.load_seconds);
    one("serval_kv_tier_hit_tokens_total", T::counter, "Prompt tokens served from a lower tier (part of the hits).",
        (double)s.tier_hit_tokens);
    one("serval_kv_tier_disk_writes_total", T::counter, "Block files written by the disk tier.",
        (double)kt.disk_writes);
    one("serval_kv_tier_disk_write_drops_total", T::counter,
        "Blocks the disk tier did not write (write queue full or a write failed).", (double)kt.disk_write_drops);
    one("serval_kv_tier_disk_corrupt_total", T::counter,
        "Disk-tier files that failed a check (deleted, never used), incl. blocks that failed on load.",
        (double)(kt.disk_corrupt));
    one("serval_kv_tier_disk_foreign_files", T::gauge, "Files of another model or KV layout in --kv-cache-dir (ignored).",
        (double)kt.disk_foreign);
    one("serval_kv_tier_disk_recovered_files", T::gauge, "Disk-tier files indexed at start.",
        (double)kt.disk_recovered);
    one("serval_kv_tier_disk_staged_reads_total", T::counter,
        "Disk-tier blocks read and checked into memory by the reader thread, ahead of their promotion.",
        (double)kt.disk_staged_reads);
    one("serval_kv_tier_disk_staged_loads_total", T::counter,
        "Promotions from the disk tier served from a staged copy (no disk read on the engine thread).",
        (double)kt.disk_staged_loads);
    one("serval_kv_tier_disk_staged_bytes", T::gauge, "Bytes of disk-tier blocks staged in memory or being read.",
        (double)kt.disk_staged_bytes);
  }
  for (const auto* f : {&ttft_f_, &itl_f_, &e2e_f_, &queue_f_, &prefill_f_, &decode_f_, &prompt_len_f_, &gen_len_f_})
    w.family(*f);
  for (const auto* f : {&status_f_, &finish_f_, &tenant_requests_f_, &tenant_prompt_f_, &tenant_gen_f_})
    w.family(*f);
  if (cfg_.prices) w.family(tenant_cost_f_);
  if (energy_) {
    w.family(tenant_energy_f_);
    if (cfg_.energy.grid_g_per_kwh > 0) w.family(tenant_carbon_f_);
  }
  if (!slos_.empty()) {
    const int64_t now = unix_now_s();
    auto slo_label = [&](const SloTracker& t, const char* window = nullptr) {
      mt::Labels l = model_;
      l.push_back({"slo", t.name()});
      if (window) l.push_back({"window", window});
      return mt::render_labels(l);
    };
    w.header("serval_slo_objective_ratio", "Target fraction of good events of each SLO.", T::gauge);
    for (const auto& t : slos_) w.sample("serval_slo_objective_ratio", slo_label(*t), t->objective());
    w.header("serval_slo_threshold_seconds", "Latency bound of a good event (latency SLOs).", T::gauge);
    for (const auto& t : slos_)
      if (t->threshold_s() > 0) w.sample("serval_slo_threshold_seconds", slo_label(*t), t->threshold_s());
    w.header("serval_slo_events_total", "Events counted by each SLO.", T::counter);
    for (const auto& t : slos_) w.sample("serval_slo_events_total", slo_label(*t), (double)t->events_total());
    w.header("serval_slo_good_events_total", "Events that met each SLO.", T::counter);
    for (const auto& t : slos_) w.sample("serval_slo_good_events_total", slo_label(*t), (double)t->good_total());
    w.header("serval_slo_attainment_ratio", "Good / total events over a sliding window (1 when none).", T::gauge);
    for (const auto& t : slos_)
      for (const auto& win : kSloWindows)
        w.sample("serval_slo_attainment_ratio", slo_label(*t, win.name), t->window(win.seconds, now).attainment());
    w.header("serval_slo_error_budget_burn_rate", "Error-budget burn rate over a sliding window (1 = exactly on budget).",
             T::gauge);
    for (const auto& t : slos_)
      for (const auto& win : kSloWindows)
        w.sample("serval_slo_error_budget_burn_rate", slo_label(*t, win.name), t->burn_rate(win.seconds, now));
  }
  if (exporter_) {
    one("serval_otlp_spans_exported_total", T::counter, "Spans accepted by the OTLP collector.",
        (double)exporter_->spans_exported());
    one("serval_otlp_spans_dropped_total", T::counter, "Spans dropped (queue full, collector down or slow).",
        (double)exporter_->spans_dropped());
    one("serval_otlp_export_failures_total", T::counter, "Failed OTLP export POSTs.",
        (double)exporter_->export_failures());
    one("serval_otlp_queue_spans", T::gauge, "Spans waiting for export.", (double)exporter_->queue_size());
  }
}

}  // namespace serval::server
