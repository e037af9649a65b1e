// The OpenAI-compatible API over the engine: routes, auth, admission control,
// streaming (SSE) and non-streaming responses, cancellation on disconnect,
// draining for graceful shutdown, /metrics (see observability.h) and
// /v1/engine/state.
//
// Threads: handle() is called on HTTP I/O threads and never blocks; engine
// events arrive on the engine thread through RequestStream notifications and
// are turned into response bytes there (cheap JSON formatting). A reaper
// thread enforces per-request deadlines. All shared state is behind mutexes
// or atomics.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "serval/engine.h"
#include "server/api_translation.h"
#include "server/batch_runner.h"
#include "server/http_server.h"
#include "server/observability.h"
#include "server/openai_request.h"
#include "server/responses_api.h"
#include "server/sessions.h"

namespace serval::server {

class BatchApi;

struct ServerConfig {
  std::vector<std::string> api_keys;         // empty: no auth
  bool shared_prefix_cache = false;          // false: prefix cache salted per API key (tenant isolation)
  bool engine_control = false;               // POST /v1/engine/{pause,resume,step} (--engine-control); off: 404
  bool webui = true;                         // the browser UI at GET / (--no-webui: 404)
  bool metrics_vllm_names = false;           // /metrics also under vLLM's names (--metrics-compat vllm)
  bool lora_runtime = false;                 // POST /v1/{load,unload}_lora_adapter (--lora-runtime); off: 404
  std::string model_name;                    // id served under /v1/models; empty: from the model
  std::vector<std::string> model_aliases;    // more ids accepted in "model" (--alias; the file's name); the
                                             // first `listed_aliases` are listed under /v1/models too
  size_t listed_aliases = 0;
  std::optional<std::string> chat_template;  // from --chat-template (overrides the model's)
  // --reasoning-format: "auto" (split <think> blocks off when the template
  // shows the model reasons), "deepseek" (always), "none" (raw text).
  std::string reasoning_format = "auto";
  // --tool-call-format: "auto" (the chat template's own format when the tool
  // grammar can write it), "generic" ({"name", "arguments"}), or a format
  // name (tool_call_format_name(): hermes, llama3_json, mistral, ...).
  std::string tool_call_format = "auto";
  // Responses API: responses kept for previous_response_id and GET
  // /v1/responses/{id} (least recently used out; 0 = none are kept).
  size_t responses_store_entries = 1024;
  // Saved sessions (sessions.h; with the engine's kv_cache_dir): at most this many.
  size_t max_sessions = 1024;
  size_t max_inflight_requests = 256;        // accepted and not finished; past it: 429
  int64_t max_inflight_tokens = 1 << 20;     // sum of (prompt + max new tokens) x n in flight; past it: 429
  double request_timeout_s = 0;              // per-request deadline; 0 = none
  ApiLimits limits;
  ObservabilityConfig observability;         // model_name is filled in by create()
};

class OpenAiServer {
 public:
  // Errors: a chat template (flag or model) that does not compile.
  static Expected<std::unique_ptr<OpenAiServer>> create(Engine& engine, ServerConfig cfg);
  ~OpenAiServer();

  void handle(http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch);

  // Readiness off; new requests get 503; in-flight ones continue.
  void begin_drain();
  bool draining() const { return draining_; }
  size_t in_flight() const { return inflight_requests_; }
  // Nothing of a request is left running: none in flight and no request's
  // state alive (a finished request still sends its last bytes after it
  // leaves in_flight()). The model router destroys a server only then.
  bool quiescent() const;

  std::string metrics_text() const;

  // The owner of a request's files and batches: "anonymous" without API keys,
  // else "key-" + a hash of its key (the key itself is never stored).
  std::string owner_of(const http::HttpRequest& req) const;
  // Runs one batch line (POST `call.url` with `call.body`) through the same
  // parsing, limits and response bodies as an HTTP request, not streamed, at
  // kBatchPriority (behind every interactive request), in the owner's
  // prefix-cache namespace. done() is called once with the status and body
  // (503 while draining, 429 at capacity: the runner retries those). Returns
  // a canceller. Any thread.
  std::function<void()> execute_line(const LineCall& call, std::function<void(LineReply)> done);
  static constexpr int32_t kBatchPriority = 2'000'000;  // the API allows priorities up to 1,000,000
  // Routes /v1/files and /v1/batches to `api` (not owned; null: 404).
  void set_batch_api(BatchApi* api) { batch_api_ = api; }
  const std::string& model_name() const { return cfg_.model_name; }
  // A loaded LoRA adapter's name (Engine::loras)?
  bool is_adapter(const std::string& name) const;
  // A name an adapter may take: 1 to 256 characters, no control characters,
  // not the base model's name or an alias.
  Status check_adapter_name(const std::string& name) const;

  struct Job;

 private:
  OpenAiServer(Engine& engine, ServerConfig cfg) : engine_(engine), cfg_(std::move(cfg)) {}
  struct InternalCall {
    int32_t priority = 0;
    uint64_t salt = 0;
  };
  // translator: an API served by translation (Messages, Responses) learns the prompt size here.
  void handle_generate(const http::HttpRequest& req, std::shared_ptr<http::ResponseChannel> ch, bool chat,
                       std::shared_ptr<RequestObservation> obs, const InternalCall* internal = nullptr,
                       ApiTranslator* translator = nullptr);
  // POST /v1/messages, /v1/messages/count_tokens (anthropic_api.h): `plain`
  // carries the translated answer, `ch` errors in Anthropic's shape.
  void handle_messages(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& plain,
                       const std::shared_ptr<http::ResponseChannel>& ch, bool count_tokens,
                       std::shared_ptr<RequestObservation> obs);
  // POST /v1/responses; GET and DELETE /v1/responses/{id} (responses_api.h).
  void handle_responses(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch,
                        std::shared_ptr<RequestObservation> obs);
  void handle_stored_response(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch);
  void handle_engine_state(const std::shared_ptr<http::ResponseChannel>& ch);
  // POST /v1/engine/pause | resume | step ({"steps": n}, 1..1000): Engine's
  // stepping control, for deterministic tests and for operators holding a
  // replica still. Answers {"paused": bool} once the engine is in that state.
  void handle_engine_control(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch);
  void handle_tokenize(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch);
  // /v1/embeddings (rerank false) and /v1/rerank (embeddings_api.h).
  void handle_embed(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch, bool rerank);
  void handle_detokenize(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch);
  // /v1/sessions[/{id}[/save|/restore]] (sessions.h).
  void handle_session(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch);
  void handle_lora_admin(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch, bool load);
  void save_session(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch,
                    const std::string& id);
  // Admission of embedding and session work: one request and `need` tokens
  // against the in-flight bounds; false after sending the 429. unadmit()
  // gives them back when the work is done.
  bool admit(const std::shared_ptr<http::ResponseChannel>& ch, int64_t need);
  void unadmit(int64_t need);
  void send_error(const std::shared_ptr<http::ResponseChannel>& ch, const ApiError& e, http::Headers extra = {});
  void send_json(const std::shared_ptr<http::ResponseChannel>& ch, int status, const std::string& body);
  bool authorized(const http::HttpRequest& req) const { return key_index(req) >= 0; }
  // Index of the request's API key in cfg_.api_keys; -1 when missing or wrong; 0 without auth.
  int key_index(const http::HttpRequest& req) const;
  void method_not_allowed(const std::shared_ptr<http::ResponseChannel>& ch, const char* allow);
  void job_done(Job& job);
  void reaper_loop();

  Engine& engine_;
  EngineInfo engine_info_;  // fixed for the engine's life
  // Whether the server still exists, for callbacks that run on the engine
  // thread (embedding completions): they lock mu and do nothing once alive is false.
  struct Life {
    std::mutex mu;
    bool alive = true;
    std::atomic<size_t> jobs{0};  // generation jobs alive (Job::counted)
  };
  std::shared_ptr<Life> life_ = std::make_shared<Life>();
  ServerConfig cfg_;
  std::optional<ChatTemplate> chat_template_;
  bool reasoning_ = false;  // chat outputs have <think> blocks split off (reasoning_format)
  GrammarCache grammar_cache_;
  ParseContext parse_ctx_;
  std::atomic<bool> draining_{false};
  std::atomic<size_t> inflight_requests_{0};
  std::atomic<int64_t> inflight_tokens_{0};
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  std::unique_ptr<Observability> obs_;
  std::unique_ptr<ResponseStore> responses_;  // stored Responses API responses (previous_response_id)
  BatchApi* batch_api_ = nullptr;
  std::unique_ptr<SessionStore> sessions_;  // null without the disk tier

  mutable std::mutex mu_;  // guards the map below
  std::map<uint64_t, std::shared_ptr<Job>> jobs_;  // owns each job until job_done()
  uint64_t next_job_ = 1;

  std::atomic<bool> stop_reaper_{false};
  std::mutex reaper_mu_;  // with reaper_cv_: the destructor wakes the reaper (a router unloads servers)
  std::condition_variable reaper_cv_;
  std::thread reaper_;
};

}  // namespace serval::server
