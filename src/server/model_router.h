// Router mode: several models behind one `serval serve` (docs/ROUTER.md).
//
// The router sits in front of one OpenAiServer per loaded model. A request
// names its model ("model" in the JSON body, or ?model= on the routes that
// have no body); the router hands it to that model's server, loading the
// model first when it is not in memory. Requests for a model that is loading
// wait (at most RouterConfig::max_waiting of them, at most load_wait_s each;
// then 503 with Retry-After). Past models_max loaded models or models_memory
// bytes, the least recently used idle model is unloaded first; models idle
// for idle_unload_s are unloaded too. A model that fails to load fails only
// its own requests, with the loader's message.
//
// The router does not know how a model is made: a ModelFactory (the serve
// command's) loads the file and builds its Engine and OpenAiServer. All
// engines share one compute thread pool (EngineConfig::pool).
//
// Threads: handle() runs on HTTP I/O threads and never blocks (but for an
// admin unload right after a reply: at most 200 ms). Loads,
// unloads, the waiting requests' deadlines and idle unloading run on the
// router's own loader thread; a request waiting for its model is handed to
// the model's server from that thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "server/http_server.h"

namespace serval::server {

class OpenAiServer;

// One model the router can serve, from -m NAME=FILE, --models-dir or the
// preset file.
struct RouterModelSpec {
  std::string name;                  // id in the API
  std::string path;                  // GGUF file
  std::vector<std::string> aliases;  // more ids the API accepts and lists
  int64_t ctx = 0;                   // context per sequence (0: the model's, at most 4096)
  size_t kv_memory = 0;              // KV pool bytes; counted against models_memory
  std::string chat_template_file;    // empty: serve's --chat-template, else the model's own
  std::string draft_model;           // empty: serve's speculative settings
  bool pinned = false;               // loaded at start, never unloaded by LRU or idleness
  // LoRA adapters loaded with the model (the preset's `lora`), each addressed
  // as a model id of its own that routes to this model, listed with it as parent.
  struct Adapter {
    std::string name, path;
    float scale = 1.0f;
  };
  std::vector<Adapter> loras;
};

// A loaded model: its server and what keeps the server's engine, model and
// tokenizer alive. The server goes first.
struct ServedModel {
  std::shared_ptr<void> owner;
  std::unique_ptr<OpenAiServer> api;
  size_t bytes = 0;           // memory held (weights + KV pool), for models_memory
  int64_t max_model_len = 0;  // for /v1/models
  ~ServedModel();
};

// Loads a model (on the router's loader thread). The error's message is what
// the model's requests are told.
using ModelFactory = std::function<Expected<std::unique_ptr<ServedModel>>(const RouterModelSpec&)>;

struct RouterConfig {
  std::vector<std::string> api_keys;  // as ServerConfig::api_keys; the admin routes need one
  size_t models_max = 0;              // loaded models at once (0: no bound)
  size_t models_memory = 0;           // bytes of loaded models (file size + KV pool; 0: no bound)
  double idle_unload_s = 0;           // unload a model idle this long (0: never)
  double load_wait_s = 120;           // a request waits at most this for its model to load
  size_t kv_bytes_default = 0;        // a model's KV pool when its spec gives none (for models_memory)
  size_t engine_extra_bytes = 0;      // what else each engine holds (swap space, the prefix cache's RAM tier)
  size_t max_waiting = 256;           // requests waiting per model; more get 503
  int max_json_depth = 64;
  bool webui = true;
};

class ModelRouter {
 public:
  // Errors: no model, a duplicate name or alias, a bound that cannot hold
  // one model.
  static Expected<std::unique_ptr<ModelRouter>> create(std::vector<RouterModelSpec> specs, ModelFactory factory,
                                                        RouterConfig cfg);
  ~ModelRouter();  // stops the loader and unloads every model
  ModelRouter(const ModelRouter&) = delete;
  ModelRouter& operator=(const ModelRouter&) = delete;

  void handle(http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch);

  // Loads `name` now on the calling thread (start-up: pinned models). Errors:
  // unknown name, the factory's error.
  Status load_now(const std::string& name);

  // Readiness off; waiting requests get 503; loaded models drain.
  void begin_drain();
  // Requests inside the loaded models' servers plus those waiting for a load.
  size_t in_flight() const;

  std::string metrics_text() const;

  enum class State { unloaded, loading, loaded, failed };
  static const char* state_name(State s);
  struct ModelStatus {
    std::string name;
    State state = State::unloaded;
    size_t bytes = 0;
    uint64_t loads = 0, unloads = 0;
    size_t waiting = 0;
    std::string error;
  };
  std::vector<ModelStatus> status() const;

 private:
  struct Waiter {
    http::HttpRequest req;
    std::shared_ptr<http::ResponseChannel> ch;
    std::chrono::steady_clock::time_point deadline;
    bool admin = false;  // POST /v1/models/{id}/load: answered with the model's state
  };
  struct Entry {
    RouterModelSpec spec;
    std::vector<std::string> ids;  // name, aliases, file name with and without .gguf
    uint64_t file_bytes = 0;
    State state = State::unloaded;
    std::shared_ptr<ServedModel> served;
    std::string error;
    std::deque<Waiter> waiters;
    std::chrono::steady_clock::time_point last_used{};
    std::chrono::steady_clock::time_point failed_at{};
    uint64_t loads = 0, load_failures = 0, evictions = 0, idle_unloads = 0, admin_unloads = 0, rejected = 0;
    double last_load_s = 0;
  };
  using Clock = std::chrono::steady_clock;

  ModelRouter(std::vector<Entry> entries, ModelFactory factory, RouterConfig cfg);
  Entry* find(const std::string& id);
  // The model a request names; null after answering it (400/404).
  Entry* route(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch);
  void dispatch(Entry& e, http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch);
  void admin(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch);
  void list_models(const std::shared_ptr<http::ResponseChannel>& ch) const;
  // Whether `e` could be unloaded now (loaded, not pinned, nothing in flight or waiting). Holds mu_.
  static bool idle(const Entry& e);
  size_t est_bytes(const Entry& e) const;
  void loader_loop();
  // Runs on load_thread_: builds `target`'s server and hands it its waiters.
  // The loader loop keeps expiring deadlines (and unloading idle models)
  // meanwhile; one load at a time.
  void finish_load(Entry* target);
  // The factory's result; an exception it throws (std::bad_alloc) is a failed load.
  Expected<std::unique_ptr<ServedModel>> make(const RouterModelSpec& spec);
  // Answers waiters once their model is loaded (hands them to its server),
  // failed (`error`) or still `state` at their deadline (503). Outside mu_.
  void release(std::vector<Waiter> ws, const std::shared_ptr<ServedModel>& served, const std::string& name,
               const std::string& error, const char* state);

  const ModelFactory factory_;
  const RouterConfig cfg_;
  mutable std::mutex mu_;  // guards entries_' mutable fields and the flags below
  std::condition_variable cv_;
  std::vector<Entry> entries_;
  std::vector<std::shared_ptr<ServedModel>> graveyard_;  // unloaded by an admin call; freed on the loader thread
  bool stop_ = false;
  bool draining_ = false;
  std::thread loader_;
  std::thread load_thread_;
  bool load_running_ = false;  // under mu_: load_thread_ has not finished its load
};

// Prometheus text of several servers as one exposition: each family once,
// every sample labelled model="<name>" unless it already has a model label.
std::string merge_model_metrics(const std::vector<std::pair<std::string, std::string>>& texts);

}  // namespace serval::server
