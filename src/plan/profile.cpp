#include "plan/profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/json_depth.h"

namespace serval::plan {

using nlohmann::json;

namespace {

// A piecewise-linear table (matmul T(n), per-sequence S(n)) at n; the last
// segment extends beyond the largest point.
double interp_table(const std::vector<ChunkPoint>& m, double n) {
  if (m.empty()) return 0;
  if (m.size() == 1) return m[0].seconds * n / (double)m[0].n_tokens;
  if (n <= m.front().n_tokens) {
    // Below the first point: the first segment's line, never below zero.
    const ChunkPoint &a = m[0], &b = m[1];
    const double slope = (b.seconds - a.seconds) / (double)(b.n_tokens - a.n_tokens);
    return std::max(0.0, a.seconds - slope * ((double)a.n_tokens - n));
  }
  size_t i = 1;
  while (i + 1 < m.size() && m[i].n_tokens < n) ++i;
  const ChunkPoint &a = m[i - 1], &b = m[i];
  const double slope = (b.seconds - a.seconds) / (double)(b.n_tokens - a.n_tokens);
  return a.seconds + slope * (n - (double)a.n_tokens);
}

}  // namespace

double step_seconds(const Profile& p, int64_t n_tokens, double decode_pairs, double prefill_pairs, int64_t n_seqs) {
  if (n_tokens <= 0) return 0;
  double t = interp_table(p.matmul, (double)n_tokens);
  t += p.attn_decode_s_per_pair * decode_pairs + p.attn_prefill_s_per_pair * prefill_pairs;
  if (n_seqs > 1) t += std::max(0.0, interp_table(p.per_seq, (double)n_seqs));
  t += p.engine_step_s + p.engine_seq_s * (double)n_seqs;
  return t;
}

double decode_step_seconds(const Profile& p, int64_t b, int64_t depth) {
  return step_seconds(p, b, (double)b * attn_pairs_of(depth, 1), 0, b);
}

Profile scaled(const Profile& p, double factor) {
  Profile q = p;
  for (auto* v : {&q.prefill, &q.matmul, &q.per_seq})
    for (ChunkPoint& c : *v) c.seconds *= factor;
  for (DecodePoint& d : q.decode) d.seconds *= factor;
  for (EnginePoint& e : q.engine) e.itl_s *= factor;
  q.attn_decode_s_per_pair *= factor;
  q.attn_prefill_s_per_pair *= factor;
  q.engine_step_s *= factor;
  q.engine_seq_s *= factor;
  return q;
}

double chunk_step_seconds(const Profile& p, int64_t n, int64_t start) {
  return n == 1 ? step_seconds(p, 1, attn_pairs_of(start, 1), 0, 1)
                : step_seconds(p, n, 0, attn_pairs_of(start, n), 1);
}

namespace {

// Least squares through the origin of the time differences between points
// that differ only in context: y = alpha * x.
struct SlopeFit {
  double sxy = 0, sxx = 0;
  void add(double x, double y) {
    sxy += x * y;
    sxx += x * x;
  }
  double slope() const { return sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0; }
};

}  // namespace

Status fit_step_model(Profile* p) {
  std::vector<ChunkPoint> pre;  // from position 0, by size
  for (size_t i = 0; i < p->prefill.size(); ++i) {
    const ChunkPoint& c = p->prefill[i];
    if (c.n_tokens < 1 || !(c.seconds > 0) || !std::isfinite(c.seconds) || c.start < 0)
      return invalid_argument("profile: prefill[" + std::to_string(i) +
                              "]: n_tokens >= 1, start >= 0 and seconds > 0 expected");
    if (c.start == 0) pre.push_back(c);
  }
  std::sort(pre.begin(), pre.end(), [](const ChunkPoint& a, const ChunkPoint& b) { return a.n_tokens < b.n_tokens; });
  if (pre.size() < 2) return invalid_argument("profile: prefill: need at least 2 chunk sizes measured from position 0");
  for (size_t i = 1; i < pre.size(); ++i)
    if (pre[i].n_tokens == pre[i - 1].n_tokens)
      return invalid_argument("profile: prefill: chunk size " + std::to_string(pre[i].n_tokens) +
                              " measured twice from position 0");
  // Attention of decodes: one batch at two depths differs by alpha per pair.
  SlopeFit dec;
  for (const DecodePoint& a : p->decode) {
    const DecodePoint* base = nullptr;  // the same batch at its smallest depth
    for (const DecodePoint& b : p->decode)
      if (b.batch == a.batch && (!base || b.depth < base->depth)) base = &b;
    if (base && base->depth != a.depth) dec.add((double)a.batch * (double)(a.depth - base->depth), a.seconds - base->seconds);
  }
  p->attn_decode_s_per_pair = dec.slope();
  // Attention of chunks: one size at two starts.
  SlopeFit chunk;
  for (const ChunkPoint& a : p->prefill) {
    if (a.n_tokens < 2 || a.start == 0) continue;
    for (const ChunkPoint& b : pre)
      if (b.n_tokens == a.n_tokens) chunk.add((double)a.n_tokens * (double)a.start, a.seconds - b.seconds);
  }
  p->attn_prefill_s_per_pair = chunk.slope();
  // Matmuls: the chunks from position 0 less their attention, made non-decreasing.
  p->matmul.clear();
  double prev = 0;
  for (const ChunkPoint& c : pre) {
    const double alpha = c.n_tokens == 1 ? p->attn_decode_s_per_pair : p->attn_prefill_s_per_pair;
    const double t = std::max({c.seconds - alpha * attn_pairs_of(0, c.n_tokens), prev, 1e-9});
    p->matmul.push_back({c.n_tokens, t, 0});
    prev = t;
  }
  // Per sequence: a decode batch of B sequences against one chunk of B tokens
  // (the extra logits rows and attention tiles), at each batch's smallest
  // depth; S(1) = 0, made non-decreasing.
  p->per_seq.clear();
  p->engine_step_s = p->engine_seq_s = 0;
  std::vector<DecodePoint> shallow;  // one per batch size, the smallest depth
  for (const DecodePoint& d : p->decode) {
    auto it = std::find_if(shallow.begin(), shallow.end(), [&](const DecodePoint& x) { return x.batch == d.batch; });
    if (it == shallow.end()) shallow.push_back(d);
    else if (d.depth < it->depth) *it = d;
  }
  std::sort(shallow.begin(), shallow.end(), [](const DecodePoint& a, const DecodePoint& b) { return a.batch < b.batch; });
  std::vector<ChunkPoint> per_seq{{1, 0.0, 0}};
  for (const DecodePoint& d : shallow) {
    if (d.batch < 2) continue;
    const double extra = d.seconds - decode_step_seconds(*p, d.batch, d.depth);  // p->per_seq is empty here
    per_seq.push_back({d.batch, std::max(extra, per_seq.back().seconds), 0});
  }
  if (per_seq.size() > 1) p->per_seq = std::move(per_seq);  // else no batch measured: no per-sequence term
  // The engine around the forward: residual = a + b * batch, least squares.
  std::vector<std::pair<double, double>> res;  // (batch, residual)
  for (const EnginePoint& e : p->engine) res.emplace_back((double)e.batch, e.itl_s - decode_step_seconds(*p, e.batch, e.depth));
  if (res.size() == 1) {
    p->engine_step_s = std::max(0.0, res[0].second);
  } else if (res.size() > 1) {
    double mx = 0, my = 0;
    for (auto [x, y] : res) mx += x, my += y;
    mx /= (double)res.size();
    my /= (double)res.size();
    double cxy = 0, cxx = 0;
    for (auto [x, y] : res) cxy += (x - mx) * (y - my), cxx += (x - mx) * (x - mx);
    double b = cxx > 0 ? cxy / cxx : 0.0;
    double a = my - b * mx;
    if (b < 0) b = 0, a = my;
    if (a < 0) {  // through the origin instead
      a = 0;
      SlopeFit o;
      for (auto [x, y] : res) o.add(x, y);
      b = o.slope();
    }
    p->engine_step_s = std::max(0.0, a);
    p->engine_seq_s = b;
  }
  return Status{};
}

json to_json(const Profile& p) {
  json pre = json::array(), dec = json::array(), eng = json::array(), mm = json::array();
  for (const auto& c : p.prefill) pre.push_back({{"n_tokens", c.n_tokens}, {"start", c.start}, {"seconds", c.seconds}});
  for (const auto& d : p.decode) dec.push_back({{"batch", d.batch}, {"depth", d.depth}, {"seconds", d.seconds}});
  for (const auto& e : p.engine) eng.push_back({{"batch", e.batch}, {"depth", e.depth}, {"itl_s", e.itl_s}});
  for (const auto& c : p.matmul) mm.push_back({{"n_tokens", c.n_tokens}, {"seconds", c.seconds}});
  json ps = json::array();
  for (const auto& c : p.per_seq) ps.push_back({{"n_seqs", c.n_tokens}, {"seconds", c.seconds}});
  return {{"version", Profile::kVersion},
          {"machine", {{"cpu", p.cpu}, {"cores", p.cores}, {"threads", p.threads}, {"isa", p.isa}}},
          {"build", p.build},
          {"created", p.created},
          {"model",
           {{"path", p.model_path},
            {"arch", p.model_arch},
            {"type", p.model_type},
            {"bytes", p.model_bytes},
            {"weight_bytes_per_token", p.weight_bytes_per_token},
            {"n_ctx", p.n_ctx}}},
          {"kv", {{"type", p.kv_type}, {"bytes_per_token", p.kv_bytes_per_token}, {"block_size", p.block_size}}},
          {"roofline", {{"mem_read_gb_s", p.mem_read_gb_s}, {"fp32_gflops", p.fp32_gflops}, {"int8_gops", p.int8_gops}}},
          {"prefill", pre},
          {"decode", dec},
          {"engine", eng},
          {"step_model",
           {{"matmul", mm},
            {"attn_decode_s_per_pair", p.attn_decode_s_per_pair},
            {"attn_prefill_s_per_pair", p.attn_prefill_s_per_pair},
            {"per_seq", ps},
            {"engine_step_s", p.engine_step_s},
            {"engine_seq_s", p.engine_seq_s}}}};
}

namespace {

constexpr size_t kMaxPoints = 4096;  // per array of a profile

// Typed, bounded field access; errors name the field path.
struct Reader {
  Status st;
  const json& obj(const json& j, const char* key, const std::string& path) {
    static const json empty = json::object();
    if (!st.ok()) return empty;
    if (!j.is_object() || !j.contains(key) || !j.at(key).is_object()) {
      st = invalid_argument("profile: '" + path + key + "' must be an object");
      return empty;
    }
    return j.at(key);
  }
  const json& arr(const json& j, const char* key, const std::string& path, size_t max_items) {
    static const json empty = json::array();
    if (!st.ok()) return empty;
    if (!j.contains(key) || !j.at(key).is_array()) {
      st = invalid_argument("profile: '" + path + key + "' must be an array");
      return empty;
    }
    if (j.at(key).size() > max_items) {
      st = invalid_argument("profile: '" + path + key + "' has more than " + std::to_string(max_items) + " items");
      return empty;
    }
    return j.at(key);
  }
  // fn(item, "path.key[i].") for each element of the array j[key], which must
  // be objects; an absent key is an error only when required.
  template <typename F>
  void each(const json& j, const char* key, const std::string& path, bool required, F&& fn) {
    if (!st.ok()) return;
    if (!j.contains(key)) {
      if (required) st = invalid_argument("profile: '" + path + key + "' must be an array");
      return;
    }
    const json& a = arr(j, key, path, kMaxPoints);
    for (size_t i = 0; st.ok() && i < a.size(); ++i) {
      const std::string item = path + key + "[" + std::to_string(i) + "].";
      if (!a[i].is_object()) {
        st = invalid_argument("profile: '" + item + "' must be an object");
        return;
      }
      fn(a[i], item);
    }
  }
  std::string str(const json& j, const char* key, const std::string& path) {
    if (!st.ok()) return {};
    if (!j.contains(key)) return {};
    if (!j.at(key).is_string() || j.at(key).get_ref<const std::string&>().size() > 4096) {
      st = invalid_argument("profile: '" + path + key + "' must be a string of at most 4096 bytes");
      return {};
    }
    return j.at(key).get<std::string>();
  }
  double num(const json& j, const char* key, const std::string& path, double lo, double hi, bool required = true) {
    if (!st.ok()) return lo;
    if (!j.contains(key)) {
      if (required) st = invalid_argument("profile: '" + path + key + "' is missing");
      return lo;
    }
    if (!j.at(key).is_number()) {
      st = invalid_argument("profile: '" + path + key + "' must be a number");
      return lo;
    }
    const double v = j.at(key).get<double>();
    if (!std::isfinite(v) || v < lo || v > hi) {
      std::ostringstream o;
      o << "profile: '" << path << key << "' = " << v << " is out of [" << lo << ", " << hi << "]";
      st = invalid_argument(o.str());
      return lo;
    }
    return v;
  }
};

}  // namespace

Expected<Profile> profile_from_json(const json& j) {
  if (!j.is_object()) return invalid_argument("profile: not a JSON object");
  Reader r;
  Profile p;
  const int v = (int)r.num(j, "version", "", 1, 1000);
  if (r.st.ok() && v != Profile::kVersion)
    return invalid_argument("profile: version " + std::to_string(v) + " is not supported (expected " +
                            std::to_string(Profile::kVersion) + ")");
  const json& m = r.obj(j, "machine", "");
  p.cpu = r.str(m, "cpu", "machine.");
  p.cores = (int32_t)r.num(m, "cores", "machine.", 0, 1 << 20, false);
  p.threads = (int32_t)r.num(m, "threads", "machine.", 1, 1 << 20);
  p.isa = r.str(m, "isa", "machine.");
  p.build = r.str(j, "build", "");
  p.created = r.str(j, "created", "");
  const json& mo = r.obj(j, "model", "");
  p.model_path = r.str(mo, "path", "model.");
  p.model_arch = r.str(mo, "arch", "model.");
  p.model_type = r.str(mo, "type", "model.");
  p.model_bytes = (uint64_t)r.num(mo, "bytes", "model.", 0, 1e15, false);
  p.weight_bytes_per_token = (uint64_t)r.num(mo, "weight_bytes_per_token", "model.", 0, 1e15, false);
  p.n_ctx = (int64_t)r.num(mo, "n_ctx", "model.", 1, 1 << 24);
  const json& kv = r.obj(j, "kv", "");
  p.kv_type = r.str(kv, "type", "kv.");
  p.kv_bytes_per_token = (uint64_t)r.num(kv, "bytes_per_token", "kv.", 1, 1e12);
  p.block_size = (int32_t)r.num(kv, "block_size", "kv.", 1, 1024);
  if (j.contains("roofline")) {
    const json& rl = r.obj(j, "roofline", "");
    p.mem_read_gb_s = r.num(rl, "mem_read_gb_s", "roofline.", 0, 1e6, false);
    p.fp32_gflops = r.num(rl, "fp32_gflops", "roofline.", 0, 1e9, false);
    p.int8_gops = r.num(rl, "int8_gops", "roofline.", 0, 1e9, false);
  }
  r.each(j, "prefill", "", true, [&](const json& o, const std::string& path) {
    p.prefill.push_back({(int32_t)r.num(o, "n_tokens", path, 1, 1 << 20), r.num(o, "seconds", path, 1e-9, 1e6),
                         (int64_t)r.num(o, "start", path, 0, 1 << 24, false)});
  });
  r.each(j, "decode", "", false, [&](const json& o, const std::string& path) {
    p.decode.push_back({(int32_t)r.num(o, "batch", path, 1, 1 << 16), (int64_t)r.num(o, "depth", path, 0, 1 << 24),
                        r.num(o, "seconds", path, 1e-9, 1e6)});
  });
  r.each(j, "engine", "", false, [&](const json& o, const std::string& path) {
    p.engine.push_back({(int32_t)r.num(o, "batch", path, 1, 1 << 16), (int64_t)r.num(o, "depth", path, 0, 1 << 24),
                        r.num(o, "itl_s", path, 1e-9, 1e6)});
  });
  if (!r.st.ok()) return r.st;
  // The fitted model is recomputed from the points, so a hand-edited point
  // and a stale fit cannot disagree; a file with a step_model but no points
  // (a synthetic profile) keeps its own.
  if (j.contains("step_model") && p.prefill.size() < 2) {
    const json& sm = r.obj(j, "step_model", "");
    r.each(sm, "matmul", "step_model.", true, [&](const json& o, const std::string& path) {
      p.matmul.push_back({(int32_t)r.num(o, "n_tokens", path, 1, 1 << 20), r.num(o, "seconds", path, 1e-9, 1e6), 0});
    });
    p.attn_decode_s_per_pair = r.num(sm, "attn_decode_s_per_pair", "step_model.", 0, 1);
    p.attn_prefill_s_per_pair = r.num(sm, "attn_prefill_s_per_pair", "step_model.", 0, 1);
    r.each(sm, "per_seq", "step_model.", false, [&](const json& o, const std::string& path) {
      p.per_seq.push_back({(int32_t)r.num(o, "n_seqs", path, 1, 1 << 20), r.num(o, "seconds", path, 0, 1e6), 0});
    });
    if (!r.st.ok()) return r.st;
    if (p.matmul.empty()) return invalid_argument("profile: 'step_model.matmul' is empty");
    for (const auto* table : {&p.matmul, &p.per_seq})
      for (size_t i = 1; i < table->size(); ++i)
        if ((*table)[i].n_tokens <= (*table)[i - 1].n_tokens || (*table)[i].seconds < (*table)[i - 1].seconds)
          return invalid_argument(std::string("profile: 'step_model.") + (table == &p.matmul ? "matmul" : "per_seq") +
                                  "' must have increasing sizes and non-decreasing seconds");
    return p;
  }
  if (auto st = fit_step_model(&p); !st.ok()) return st;
  return p;
}

Expected<Profile> read_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot read profile '" + path + "'");
  std::string text;
  constexpr size_t kMax = 16u << 20;
  text.resize(kMax + 1);
  in.read(text.data(), (std::streamsize)text.size());
  text.resize((size_t)in.gcount());
  if (text.size() > kMax) return invalid_argument("profile '" + path + "' is larger than 16 MiB");
  if (json_nesting_depth(text) > 16) return invalid_argument("profile '" + path + "' nests deeper than 16 levels");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("profile '" + path + "' is not valid JSON");
  auto p = profile_from_json(j);
  if (!p.ok()) return p.status().with_context(path);
  return p;
}

}  // namespace serval::plan
