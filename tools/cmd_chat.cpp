// serval chat -m MODEL [--chat-template FILE] [--system TEXT] [-n N] [--temp T] [--top-k K] [--top-p P] ...
//
// An interactive chat in the terminal with the model's chat template: the
// answer streams as it is generated, a speed line follows it (stderr), and
// Ctrl-C stops the answer, not the program. History is kept within the
// context: when a turn no longer fits, the oldest turns are dropped with a
// notice. Commands: /help, /clear, /system [TEXT], /params [k=v ...],
// /save FILE, /load FILE, /exit. A line ending in '\' continues on the next;
// a line of """ opens and closes a multi-line message.
//
// Over a pipe (stdin or stdout not a terminal) there are no prompts or
// colours: each input line is a message (or a command), each answer is
// written to stdout followed by a newline.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "kv_cache/kv_storage.h"
#include "kv_type_flag.h"
#include "load_model.h"
#include "sampling_flags.h"
#include "serval/engine.h"
#include "tokenizer/chat_template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

namespace {

using json = nlohmann::ordered_json;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

constexpr size_t kMaxFileBytes = size_t{16} << 20;  // /load and --chat-template
constexpr size_t kMaxInputBytes = size_t{1} << 20;  // one message

bool read_bounded(const std::string& path, std::string* out, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->clear();
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    out->append(buf, (size_t)in.gcount());
    if (out->size() > limit) return false;
  }
  return true;
}

struct Style {
  bool tty = false;
  const char* dim() const { return tty ? "\033[2m" : ""; }
  const char* bold() const { return tty ? "\033[1m" : ""; }
  const char* reset() const { return tty ? "\033[0m" : ""; }
};

// Standard input, read with poll() so that a Ctrl-C is seen within 100 ms
// whenever it comes (a flag checked before a blocking read could miss it).
class Input {
 public:
  // One line (without the newline); false at end of input or on Ctrl-C (g_interrupted).
  bool line(std::string* out) {
    out->clear();
    for (;;) {
      const int c = next();
      if (c == kInterrupted) return false;
      if (c == kEof) return !out->empty();
      if (c == '\n') return true;
      if (out->size() < kMaxInputBytes) out->push_back((char)c);
    }
  }

 private:
  static constexpr int kEof = -1, kInterrupted = -2;
  int next() {
    if (at_ < n_) return (unsigned char)buf_[at_++];
    for (;;) {
      if (g_interrupted) return kInterrupted;
      pollfd p{STDIN_FILENO, POLLIN, 0};
      const int r = poll(&p, 1, 100);
      if (r <= 0) continue;  // timeout or EINTR: check the flag again
      const ssize_t k = read(STDIN_FILENO, buf_, sizeof buf_);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return kEof;
      n_ = (size_t)k;
      at_ = 0;
      return (unsigned char)buf_[at_++];
    }
  }
  char buf_[4096];
  size_t at_ = 0, n_ = 0;
};

class Chat {
 public:
  Chat(Engine& engine, const Tokenizer& tok, const ChatTemplate& tmpl, int64_t ctx, Style style)
      : engine_(engine), tok_(tok), tmpl_(tmpl), ctx_(ctx), st_(style) {}

  SamplingParams params;
  int32_t max_tokens = 512;
  std::string system;
  json messages = json::array();  // user / assistant turns

  // Generates the answer to the last user message and appends it.
  void answer() {
    std::vector<TokenId> prompt;
    while (true) {
      auto p = render();
      if (!p.ok()) {
        std::fprintf(stderr, "error: %s\n", p.status().message().c_str());
        messages.erase(messages.end() - 1);
        return;
      }
      prompt = std::move(*p);
      // Room for an answer: max_tokens, or a quarter of the context if less.
      const int64_t room = std::max<int64_t>(1, std::min<int64_t>(max_tokens, ctx_ / 4));
      if ((int64_t)prompt.size() + room <= ctx_ || messages.size() <= 1) break;
      // The oldest turn goes (a user message and the answer to it).
      const size_t drop = messages.size() >= 3 ? 2 : 1;
      messages.erase(messages.begin(), messages.begin() + (ptrdiff_t)drop);
      std::fprintf(stderr, "%s[the context is full: dropped the oldest turn]%s\n", st_.dim(), st_.reset());
    }
    if ((int64_t)prompt.size() + 1 >= ctx_) {
      std::fprintf(stderr, "error: the message is %zu tokens, the context only %lld\n", prompt.size(),
                   (long long)ctx_);
      messages.erase(messages.end() - 1);
      return;
    }
    Request req;
    req.prompt = prompt;
    req.params = params;
    req.params.max_tokens = (int32_t)std::min<int64_t>(max_tokens, ctx_ - (int64_t)prompt.size());
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    auto stream = engine_.submit(std::move(req));
    if (!stream.ok()) {
      std::fprintf(stderr, "error: %s\n", stream.status().message().c_str());
      messages.erase(messages.end() - 1);
      return;
    }
    g_interrupted = false;
    std::string text;
    int64_t n_gen = 0;
    auto t1 = t0;
    bool stopped = false, failed = false;
    OutputEvent ev;
    while (!(*stream)->done()) {
      if (g_interrupted && !stopped) {
        engine_.cancel((*stream)->id());
        stopped = true;
      }
      if (!(*stream)->next_for(&ev, 50)) continue;
      if (!ev.error.ok()) {
        if (!stopped) {
          std::fprintf(stderr, "\nerror: %s\n", ev.error.message().c_str());
          failed = true;
        }
        break;
      }
      if (n_gen == 0 && !ev.tokens.empty()) t1 = clock::now();
      n_gen += (int64_t)ev.tokens.size();
      text += ev.text;
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    }
    g_interrupted = false;
    const auto t2 = clock::now();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (failed) {
      messages.erase(messages.end() - 1);
      return;
    }
    messages.push_back({{"role", "assistant"}, {"content", text}});  // a stopped answer is kept as far as it got
    const double pre_s = std::chrono::duration<double>(t1 - t0).count();
    const double gen_s = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "%s[%s%lld tokens, %.1f tok/s | prompt %zu tokens, %.2f s]%s\n", st_.dim(),
                 stopped ? "stopped: " : "", (long long)n_gen, gen_s > 0 ? (double)n_gen / gen_s : 0.0, prompt.size(),
                 pre_s, st_.reset());
  }

  // The conversation as a prompt (the template's own text, BOS where it has none).
  Expected<std::vector<TokenId>> render() const {
    json msgs = json::array();
    if (!system.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
    for (const auto& m : messages) msgs.push_back(m);
    ChatContextOptions opt;
    opt.add_generation_prompt = true;
    if (tok_.bos() >= 0) opt.bos_token = tok_.token_text(tok_.bos());
    if (tok_.eos() >= 0) opt.eos_token = tok_.token_text(tok_.eos());
    auto ctx = build_chat_context(msgs, opt);
    if (!ctx.ok()) return ctx.status();
    auto text = tmpl_.render(*ctx);
    if (!text.ok()) return text.status().with_context("chat template");
    const bool has_bos = !opt.bos_token.empty() && text->rfind(opt.bos_token, 0) == 0;
    return tok_.encode(*text, !has_bos && tok_.add_bos(), /*parse_special=*/true);
  }

  json to_json() const {
    json p = {{"temperature", params.temperature}, {"top_k", params.top_k}, {"top_p", params.top_p},
              {"min_p", params.min_p}, {"repeat_penalty", params.repetition_penalty}, {"max_tokens", max_tokens},
              {"ignore_eos", params.ignore_eos}};
    if (params.seed) p["seed"] = *params.seed;
    return {{"system", system}, {"messages", messages}, {"params", p}};
  }

  // Sets one parameter from "key=value"; the error otherwise.
  std::string set_param(const std::string& kv) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) return "expected key=value, got '" + kv + "'";
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x)) {
      if (k == "ignore_eos" && (v == "true" || v == "false")) {
        params.ignore_eos = v == "true";
        return {};
      }
      return k + ": '" + v + "' is not a number";
    }
    SamplingParams p = params;
    int32_t mt = max_tokens;
    auto integer = [&](int64_t lo, int64_t hi) { return x == std::floor(x) && x >= (double)lo && x <= (double)hi; };
    if (k == "temp" || k == "temperature") p.temperature = (float)x;
    else if (k == "top_p") p.top_p = (float)x;
    else if (k == "min_p") p.min_p = (float)x;
    else if (k == "repeat_penalty") p.repetition_penalty = (float)x;
    else if (k == "top_k" && integer(-1, 1 << 24)) p.top_k = (int32_t)x;
    else if (k == "seed" && integer(0, (int64_t)1 << 53)) p.seed = (uint64_t)x;
    else if ((k == "max_tokens" || k == "n") && integer(1, 1 << 20)) mt = (int32_t)x;
    else if (k == "ignore_eos" && (x == 0 || x == 1)) p.ignore_eos = x == 1;
    else return "unknown parameter or bad value: '" + kv + "' (temp, top_p, top_k, min_p, repeat_penalty, seed, max_tokens, ignore_eos)";
    if (Status s = p.validate((int32_t)tok_.n_vocab()); !s.ok()) return s.message();
    params = p;
    max_tokens = mt;
    return {};
  }

  std::string load(const std::string& path) {
    std::string text;
    if (!read_bounded(path, &text, kMaxFileBytes)) return "cannot read '" + path + "' (or larger than 16 MiB)";
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("messages") || !j["messages"].is_array())
      return "'" + path + "' is not a saved chat ({\"system\", \"messages\", \"params\"})";
    json msgs = json::array();
    for (const auto& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["content"].is_string() ||
          (m["role"] != "user" && m["role"] != "assistant"))
        return "'" + path + "': each message needs role user/assistant and string content";
      msgs.push_back({{"role", m["role"]}, {"content", m["content"]}});
    }
    if (j.contains("system") && !j["system"].is_string()) return "'" + path + "': system must be a string";
    Chat trial = *this;
    if (j.contains("params") && j["params"].is_object()) {
      for (auto it = j["params"].begin(); it != j["params"].end(); ++it) {
        const json& v = it.value();
        const std::string val = v.is_boolean() ? (v.get<bool>() ? "true" : "false") : v.dump();
        if (std::string e = trial.set_param(it.key() + "=" + val); !e.empty()) return "'" + path + "': " + e;
      }
    }
    params = trial.params;
    max_tokens = trial.max_tokens;
    system = j.value("system", "");
    messages = std::move(msgs);
    return {};
  }

 private:
  Engine& engine_;
  const Tokenizer& tok_;
  const ChatTemplate& tmpl_;
  int64_t ctx_;
  Style st_;
};

const char* kHelp =
    "  /help            this list\n"
    "  /clear           forget the conversation (the system prompt stays)\n"
    "  /system [TEXT]   show or set the system prompt\n"
    "  /params [k=v..]  show or set temp, top_p, top_k, min_p, repeat_penalty, seed, max_tokens, ignore_eos\n"
    "  /save FILE       write the conversation and parameters (JSON)\n"
    "  /load FILE       restore them\n"
    "  /exit            quit (also Ctrl-D)\n"
    "  a line ending in \\ continues on the next; \"\"\" opens and closes a multi-line message;\n"
    "  Ctrl-C stops an answer\n";

}  // namespace

int cmd_chat(int argc, char** argv) {
  const std::string cmd = "serval chat";
  CLI::App app("Chat with a model in the terminal, with its chat template", cmd);
  std::string model_path, template_file, system, kv_memory = "1G";
  int n_predict = 512, threads = 0, ctx = 0;
  SamplingFlags sampling;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  app.add_option("--chat-template", template_file, "Jinja chat template file (overrides the model's)");
  app.add_option("-s,--system", system, "system prompt");
  app.add_option("-n,--n-predict", n_predict, "most tokens per answer")->check(CLI::Range(1, 1 << 20));
  app.add_option("-c,--ctx-size", ctx, "context: the conversation is kept within it (0: the model's, at most 4096)")
      ->check(CLI::Range(0, 1 << 20));
  sampling.add_to(app);
  app.add_option("--kv-memory", kv_memory, "KV cache pool: bytes (512M, 2G) or a fraction of free RAM");
  KvType kv_type = EngineConfig{}.kv_type;
  add_kv_type_option(app, &kv_type);
  app.add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));
  if (auto rc = parse(app, argc, argv)) return *rc;

  std::optional<std::string> from_flag;
  if (!template_file.empty()) {
    std::string t;
    if (!read_bounded(template_file, &t, 256 * 1024))
      return fail(cmd, "cannot read --chat-template '" + template_file + "' (or larger than 256 KiB)");
    from_flag = t;
  }
  auto loaded = load_model(cmd, model_path);
  if (!loaded) return 2;
  const Model& m = *loaded->model;
  const Tokenizer& tok = *loaded->tok;
  const int64_t n_ctx = ctx > 0 ? ctx : std::min<int64_t>(m.config().n_ctx_train, 4096);
  EngineConfig ec;
  ec.n_threads = threads;
  ec.max_model_len = n_ctx;
  ec.kv_type = kv_type;
  auto kvb = parse_kv_memory(kv_memory);
  if (!kvb.ok()) return fail(cmd, kvb.status().message());
  const size_t per_token = KvGeometry{(int32_t)m.config().n_layers, (int32_t)m.config().kv_dim(), 16, kv_type}.bytes_per_token();
  ec.kv_memory_bytes = std::min<size_t>(*kvb, (size_t)(n_ctx + 64) * per_token);
  auto engine = Engine::create(loaded->model, tok, ec);
  if (!engine.ok()) return fail(cmd, engine.status().message());
  const EngineInfo info = (*engine)->info();
  std::optional<std::string> from_model;
  if (!info.chat_template.empty()) from_model = info.chat_template;
  auto tmpl = select_chat_template(from_flag, from_model);
  if (!tmpl.ok()) return fail(cmd, tmpl.status().message());

  Style style;
  style.tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO) && !std::getenv("NO_COLOR") &&
              std::string(std::getenv("TERM") ? std::getenv("TERM") : "") != "dumb";
  const bool interactive = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
  Chat chat(**engine, tok, *tmpl, n_ctx, style);
  chat.system = system;
  chat.max_tokens = n_predict;
  sampling.apply(&chat.params);
  if (Status s = chat.params.validate((int32_t)tok.n_vocab()); !s.ok()) return fail(cmd, s.message());

  // Ctrl-C: stops an answer; at the prompt, it ends the program. No SA_RESTART,
  // so a read in progress returns.
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  if (interactive)
    std::printf("%sserval chat%s: %s, %lld tokens of context. /help for commands, Ctrl-D to quit.\n", style.bold(),
                style.reset(), info.model_name.c_str(),
                (long long)n_ctx);
  std::string line;
  Input input;
  for (;;) {
    g_interrupted = false;  // before the prompt shows: a Ctrl-C from here on ends the program
    if (interactive) {
      std::printf("%s> %s", style.bold(), style.reset());
      std::fflush(stdout);
    }
    if (!input.line(&line)) break;
    // Continuations: a trailing backslash, or a """ block.
    std::string msg = line;
    if (msg == "\"\"\"") {
      msg.clear();
      bool closed = false;
      while (!closed) {
        if (interactive) std::printf("%s. %s", style.dim(), style.reset()), std::fflush(stdout);
        if (!input.line(&line)) break;
        if (line == "\"\"\"") closed = true;
        else msg += (msg.empty() ? "" : "\n") + line;
      }
      if (!closed) break;
    } else {
      while (!msg.empty() && msg.back() == '\\') {
        msg.back() = '\n';
        if (interactive) std::printf("%s. %s", style.dim(), style.reset()), std::fflush(stdout);
        if (!input.line(&line)) break;
        msg += line;
      }
    }
    const size_t first = msg.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) continue;
    if (msg[first] == '/' && msg.find('\n') == std::string::npos) {
      std::istringstream in(msg.substr(first));
      std::string c, arg;
      in >> c;
      std::getline(in >> std::ws, arg);
      if (c == "/exit" || c == "/quit" || c == "/bye") break;
      if (c == "/help") {
        std::fputs(kHelp, stdout);
      } else if (c == "/clear") {
        chat.messages = json::array();
        std::printf("conversation cleared\n");
      } else if (c == "/system") {
        if (arg.empty()) std::printf("system prompt: %s\n", chat.system.empty() ? "(none)" : chat.system.c_str());
        else chat.system = arg, std::printf("system prompt set\n");
      } else if (c == "/params") {
        std::istringstream kvs(arg);
        std::string kv, err;
        while (err.empty() && kvs >> kv) err = chat.set_param(kv);
        if (!err.empty()) std::printf("error: %s\n", err.c_str());
        else std::printf("%s\n", chat.to_json()["params"].dump().c_str());
      } else if (c == "/save") {
        if (arg.empty()) {
          std::printf("error: /save needs a file name\n");
        } else {
          std::ofstream out(arg, std::ios::binary | std::ios::trunc);
          out << chat.to_json().dump(2) << "\n";
          if (out.good()) std::printf("saved %zu messages to %s\n", chat.messages.size(), arg.c_str());
          else std::printf("error: cannot write '%s'\n", arg.c_str());
        }
      } else if (c == "/load") {
        if (arg.empty()) std::printf("error: /load needs a file name\n");
        else if (std::string e = chat.load(arg); !e.empty()) std::printf("error: %s\n", e.c_str());
        else std::printf("loaded %zu messages from %s\n", chat.messages.size(), arg.c_str());
      } else {
        std::printf("unknown command '%s' (/help lists them)\n", c.c_str());
      }
      std::fflush(stdout);
      continue;
    }
    chat.messages.push_back({{"role", "user"}, {"content", msg}});
    chat.answer();
  }
  if (interactive) std::printf("\n");
  return 0;
}

}  // namespace serval::cli
