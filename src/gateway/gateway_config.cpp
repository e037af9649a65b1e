#include "gateway/gateway_config.h"

#include <openssl/sha.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#define TOML_ENABLE_FORMATTERS 0
#include <toml++/toml.h>

namespace serval::gateway {

namespace {

// Thrown inside the parser only; turned into a Status at its boundary.
struct ConfigError {
  std::string message;
};

bool is_hex64(std::string_view s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Reads one TOML table: every key read is remembered; finish() refuses the rest.
class TableReader {
 public:
  TableReader(const toml::table& t, std::string path, const std::string& file) : t_(t), path_(std::move(path)), file_(file) {}

  [[noreturn]] void fail(const toml::node* n, const std::string& key, const std::string& msg) const {
    const auto& src = n ? n->source() : t_.source();
    std::string where = file_ + ":" + std::to_string(src.begin.line);
    throw ConfigError{where + ": " + qualified(key) + ": " + msg};
  }
  std::string qualified(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const toml::node* get(const std::string& key) {
    seen_.insert(key);
    return t_.get(key);
  }

  template <typename T>
  void number(const std::string& key, T* out, double lo, double hi) {
    const toml::node* n = get(key);
    if (!n) return;
    double v;
    if (auto i = n->as_integer()) v = (double)i->get();
    else if (auto f = n->as_floating_point()) v = f->get();
    else fail(n, key, "expected a number");
    if (!std::isfinite(v) || v < lo || v > hi) {
      std::ostringstream m;
      m << "expected a number in [" << lo << ", " << hi << "], got " << v;
      fail(n, key, m.str());
    }
    if constexpr (std::is_integral_v<T>) {
      if (v != std::floor(v)) fail(n, key, "expected an integer");
    }
    *out = (T)v;
  }
  void boolean(const std::string& key, bool* out) {
    const toml::node* n = get(key);
    if (!n) return;
    auto b = n->as_boolean();
    if (!b) fail(n, key, "expected true or false");
    *out = b->get();
  }
  void string(const std::string& key, std::string* out, size_t max_len = 4096) {
    const toml::node* n = get(key);
    if (!n) return;
    auto s = n->as_string();
    if (!s) fail(n, key, "expected a string");
    if (s->get().size() > max_len) fail(n, key, "longer than " + std::to_string(max_len) + " bytes");
    *out = s->get();
  }
  std::vector<std::string> strings(const std::string& key, size_t max_n = 1024) {
    std::vector<std::string> out;
    const toml::node* n = get(key);
    if (!n) return out;
    auto a = n->as_array();
    if (!a) fail(n, key, "expected an array of strings");
    if (a->size() > max_n) fail(n, key, "more than " + std::to_string(max_n) + " entries");
    for (size_t i = 0; i < a->size(); ++i) {
      auto s = a->get(i)->as_string();
      if (!s) fail(a->get(i), key + "[" + std::to_string(i) + "]", "expected a string");
      out.push_back(s->get());
    }
    return out;
  }
  const toml::node* node(const std::string& key) const { return t_.get(key); }
  void finish() const {
    for (const auto& [k, v] : t_) {
      const std::string key(k.str());
      if (!seen_.count(key)) fail(&v, key, "unknown key");
    }
  }

 private:
  const toml::table& t_;
  std::string path_;
  const std::string& file_;
  std::set<std::string> seen_;
};

void read_model(TableReader& r, ModelRoute* m, const std::string& name) {
  r.string("name", &m->name, 256);
  if (m->name.empty()) r.fail(nullptr, "name", "missing (every [[models]] entry needs a name)");
  m->aliases = r.strings("aliases");
  r.string("upstream_model", &m->upstream_model, 256);
  m->fallback = r.strings("fallback", 16);
  const toml::node* up = r.node("upstreams");
  const auto urls = r.strings("upstreams", 256);
  if (urls.empty()) r.fail(up, "upstreams", "expected at least one upstream URL");
  for (size_t i = 0; i < urls.size(); ++i) {
    auto u = parse_upstream_url(urls[i]);
    if (!u) r.fail(up->as_array()->get(i), "upstreams[" + std::to_string(i) + "]", u.status().message());
    m->upstreams.push_back(*u);
  }
  std::string discovery = "static";
  r.string("discovery", &discovery, 16);
  if (discovery == "dns") m->discover_dns = true;
  else if (discovery != "static") r.fail(r.node("discovery"), "discovery", "expected \"static\" or \"dns\", got \"" + discovery + "\"");
  r.number("connect_timeout_s", &m->connect_timeout_s, 0.01, 600);
  r.number("first_byte_timeout_s", &m->first_byte_timeout_s, 0.01, 86400);
  r.number("idle_timeout_s", &m->idle_timeout_s, 0.01, 86400);
  r.number("price_input_per_mtok", &m->price_input_per_mtok, 0, 1e6);
  r.number("price_output_per_mtok", &m->price_output_per_mtok, 0, 1e6);
  r.string("api_key", &m->api_key, 1024);
  r.string("api_key_file", &m->api_key_file, 4096);
  if (!m->api_key.empty() && !m->api_key_file.empty()) r.fail(r.node("api_key_file"), "api_key_file", "give api_key or api_key_file, not both");
  if (!m->api_key_file.empty()) {
    std::ifstream f(m->api_key_file);
    if (!f) r.fail(r.node("api_key_file"), "api_key_file", "cannot read '" + m->api_key_file + "'");
    std::string line;
    while (std::getline(f, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty()) break;
    }
    if (line.empty() || line.size() > 1024) r.fail(r.node("api_key_file"), "api_key_file", "'" + m->api_key_file + "' holds no key (one per line)");
    m->api_key = line;
  }
  r.boolean("serval", &m->serval);
  r.string("health_path", &m->health_path, 256);
  r.string("metrics_path", &m->metrics_path, 256);
  for (const std::string* p : {&m->health_path, &m->metrics_path})
    if (!p->empty() && (*p)[0] != '/') r.fail(nullptr, p == &m->health_path ? "health_path" : "metrics_path", "expected a path starting with '/'");
  (void)name;
  r.finish();
}

void read_key(TableReader& r, KeyConfig* k) {
  r.string("name", &k->name, 128);
  if (k->name.empty()) r.fail(nullptr, "name", "missing (every [[keys]] entry needs a name)");
  r.string("sha256", &k->sha256, 64);
  if (!is_hex64(k->sha256))
    r.fail(r.node("sha256"), "sha256", "expected the key's SHA-256 as 64 lower-case hex digits (serval gateway hash-key KEY)");
  r.number("rpm", &k->rpm, 0, 1e9);
  r.number("tpm", &k->tpm, 0, 1e12);
  r.number("max_parallel", &k->max_parallel, 0, 1e6);
  k->models = r.strings("models");
  r.number("budget", &k->budget, 0, 1e12);
  std::string period = "month";
  r.string("budget_period", &period, 16);
  if (period == "day") k->budget_period = BudgetPeriod::day;
  else if (period == "month") k->budget_period = BudgetPeriod::month;
  else if (period == "total") k->budget_period = BudgetPeriod::total;
  else r.fail(r.node("budget_period"), "budget_period", "expected \"day\", \"month\" or \"total\", got \"" + period + "\"");
  r.finish();
}

template <typename F>
void each_table(TableReader& root, const std::string& key, const std::string& file, F&& f) {
  const toml::node* n = root.get(key);
  if (!n) return;
  auto arr = n->as_array();
  if (!arr) root.fail(n, key, "expected an array of tables ([[" + key + "]])");
  for (size_t i = 0; i < arr->size(); ++i) {
    auto t = arr->get(i)->as_table();
    if (!t) root.fail(arr->get(i), key + "[" + std::to_string(i) + "]", "expected a table");
    TableReader r(*t, key + "[" + std::to_string(i) + "]", file);
    f(r);
  }
}

GatewayConfig read_config(const toml::table& root_t, const std::string& file) {
  GatewayConfig c;
  c.source = file;
  TableReader root(root_t, "", file);
  auto section = [&](const std::string& key, auto&& f) {
    const toml::node* n = root.get(key);
    if (!n) return;
    auto t = n->as_table();
    if (!t) root.fail(n, key, "expected a table ([" + key + "])");
    TableReader r(*t, key, file);
    f(r);
    r.finish();
  };
  section("server", [&](TableReader& r) {
    r.string("host", &c.host, 256);
    r.number("port", &c.port, 0, 65535);
    r.number("threads", &c.threads, 1, 64);
    r.number("max_inflight", &c.max_inflight, 1, 100000);
    r.number("request_timeout_s", &c.request_timeout_s, 0.01, 86400);
    r.number("drain_timeout_s", &c.drain_timeout_s, 0, 3600);
    r.number("max_body_bytes", &c.max_body_bytes, 1024, 1 << 30);
  });
  section("routing", [&](TableReader& r) {
    std::string p = "cache_aware";
    r.string("policy", &p, 32);
    if (p == "cache_aware") c.policy = Policy::cache_aware;
    else if (p == "round_robin") c.policy = Policy::round_robin;
    else if (p == "least_loaded") c.policy = Policy::least_loaded;
    else r.fail(r.node("policy"), "policy", "expected \"cache_aware\", \"round_robin\" or \"least_loaded\", got \"" + p + "\"");
    r.number("cache_threshold", &c.cache_threshold, 0, 1);
    r.number("balance_abs_threshold", &c.balance_abs_threshold, 0, 1e6);
    r.number("balance_rel_threshold", &c.balance_rel_threshold, 1, 1e6);
    r.number("chunk_chars", &c.chunk_chars, 4, 65536);
    r.number("max_tree_chunks", &c.max_tree_chunks, 16, 1e8);
    r.number("queue_timeout_s", &c.queue_timeout_s, 0, 86400);
  });
  section("health", [&](TableReader& r) {
    r.number("interval_s", &c.health_interval_s, 0.05, 3600);
    r.number("timeout_s", &c.health_timeout_s, 0.01, 600);
  });
  section("breaker", [&](TableReader& r) {
    r.number("failures", &c.breaker_failures, 1, 1e6);
    r.number("open_s", &c.breaker_open_s, 0.01, 3600);
    r.number("max_open_s", &c.breaker_max_open_s, 0.01, 86400);
  });
  if (c.breaker_max_open_s < c.breaker_open_s) c.breaker_max_open_s = c.breaker_open_s;
  section("retry", [&](TableReader& r) {
    r.number("attempts", &c.retry_attempts, 1, 100);
    r.number("backoff_ms", &c.retry_backoff_ms, 0, 60000);
    r.number("max_backoff_ms", &c.retry_max_backoff_ms, 0, 600000);
  });
  section("auth", [&](TableReader& r) {
    r.string("admin_key_sha256", &c.admin_key_sha256, 64);
    if (!c.admin_key_sha256.empty() && !is_hex64(c.admin_key_sha256))
      r.fail(r.node("admin_key_sha256"), "admin_key_sha256", "expected 64 lower-case hex digits (serval gateway hash-key KEY)");
    r.boolean("require_key", &c.require_key);
    r.string("db", &c.db_path, 4096);
  });
  each_table(root, "models", file, [&](TableReader& r) {
    ModelRoute m;
    read_model(r, &m, "");
    c.models.push_back(std::move(m));
  });
  each_table(root, "keys", file, [&](TableReader& r) {
    KeyConfig k;
    read_key(r, &k);
    c.keys.push_back(std::move(k));
  });
  root.finish();

  if (c.models.empty()) throw ConfigError{file + ": no [[models]] entry (the gateway needs at least one model with upstreams)"};
  // Names and aliases are unique; fallbacks and key model lists name routes.
  std::set<std::string> names;
  const toml::array* models_arr = root_t.get("models")->as_array();
  for (size_t i = 0; i < c.models.size(); ++i) {
    const auto& m = c.models[i];
    const std::string line = file + ":" + std::to_string(models_arr->get(i)->source().begin.line) + ": models[" + std::to_string(i) + "]";
    for (const auto& n : [&] { auto v = m.aliases; v.insert(v.begin(), m.name); return v; }())
      if (!names.insert(n).second) throw ConfigError{line + ": model name or alias '" + n + "' is used twice"};
  }
  for (size_t i = 0; i < c.models.size(); ++i) {
    const std::string line = file + ":" + std::to_string(models_arr->get(i)->source().begin.line) + ": models[" + std::to_string(i) + "].fallback";
    for (const auto& f : c.models[i].fallback) {
      if (!names.count(f)) throw ConfigError{line + ": no model named '" + f + "'"};
      if (f == c.models[i].name) throw ConfigError{line + ": a model cannot fall back to itself"};
    }
  }
  std::set<std::string> key_names, key_hashes;
  for (size_t i = 0; i < c.keys.size(); ++i) {
    const std::string line = file + ":" + std::to_string(root_t.get("keys")->as_array()->get(i)->source().begin.line) + ": keys[" + std::to_string(i) + "]";
    if (!key_names.insert(c.keys[i].name).second) throw ConfigError{line + ".name: '" + c.keys[i].name + "' is used twice"};
    if (!key_hashes.insert(c.keys[i].sha256).second) throw ConfigError{line + ".sha256: the same key is declared twice"};
    for (const auto& m : c.keys[i].models)
      if (!names.count(m)) throw ConfigError{line + ".models: no model named '" + m + "'"};
  }
  return c;
}

}  // namespace

std::string_view policy_name(Policy p) {
  switch (p) {
    case Policy::cache_aware: return "cache_aware";
    case Policy::round_robin: return "round_robin";
    case Policy::least_loaded: return "least_loaded";
  }
  return "?";
}

Expected<UpstreamUrl> parse_upstream_url(std::string_view url) {
  UpstreamUrl u;
  constexpr std::string_view scheme = "http://";
  if (url.size() > 2048) return invalid_argument("URL longer than 2048 bytes");
  if (url.substr(0, scheme.size()) != scheme)
    return invalid_argument("expected a URL http://host:port, got '" + std::string(url) + "'" +
                            (url.substr(0, 8) == "https://" ? " (TLS upstreams are not supported; use a local proxy)" : ""));
  std::string_view rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (hostport.empty()) return invalid_argument("URL '" + std::string(url) + "' has no host");
  if (hostport.front() == '[') {
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos) return invalid_argument("URL '" + std::string(url) + "': unterminated IPv6 address");
    u.host = std::string(hostport.substr(1, close - 1));
    std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return invalid_argument("URL '" + std::string(url) + "': bad port");
      u.port = std::string(after.substr(1));
    }
  } else {
    const size_t colon = hostport.rfind(':');
    u.host = std::string(hostport.substr(0, colon));
    if (colon != std::string_view::npos) u.port = std::string(hostport.substr(colon + 1));
  }
  if (u.host.empty()) return invalid_argument("URL '" + std::string(url) + "' has no host");
  if (u.port.empty() || u.port.size() > 5 || !std::all_of(u.port.begin(), u.port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(u.port) < 1 || std::stoi(u.port) > 65535)
    return invalid_argument("URL '" + std::string(url) + "': port must be 1..65535");
  std::string base(path);
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (base.size() >= 3 && base.compare(base.size() - 3, 3, "/v1") == 0) base.resize(base.size() - 3);
  if (base.find_first_of("?# ") != std::string::npos) return invalid_argument("URL '" + std::string(url) + "': no query or fragment allowed");
  u.base = base;
  u.host_header = (u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host) + ":" + u.port;
  u.url = "http://" + u.host_header + u.base;
  return u;
}

Expected<GatewayConfig> parse_gateway_config(std::string_view toml_text, const std::string& name) {
  try {
    toml::table t = toml::parse(toml_text, name);
    return read_config(t, name);
  } catch (const toml::parse_error& e) {
    return invalid_file(name + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  } catch (const ConfigError& e) {
    return invalid_file(e.message);
  }
}

Expected<GatewayConfig> load_gateway_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return io_error("cannot open gateway config '" + path + "'");
  std::string text;
  char buf[65536];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {
    text.append(buf, (size_t)f.gcount());
    if (text.size() > (4u << 20)) return invalid_file(path + ": larger than 4 MiB");
  }
  return parse_gateway_config(text, path);
}

std::string sha256_hex(std::string_view data) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), md);
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (unsigned char b : md) {
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

}  // namespace serval::gateway
