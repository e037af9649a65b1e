#include "quantize/quant_policy.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <cstdlib>

namespace serval::quant {
namespace {

std::string upper(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = (char)std::toupper((unsigned char)c);
  return r;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// Layer index of "blk.N.*", or -1.
int64_t layer_of(std::string_view name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  const char* p = name.data() + 4;
  char* end = nullptr;
  const long v = std::strtol(p, &end, 10);
  return (end != p && end < name.data() + name.size() && *end == '.') ? v : -1;
}

// llama.cpp's use_more_bits: first and last eighth of the layers, and every third in between.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int64_t block_of(DType t) { return (int64_t)dtype_traits(t)->block_size; }

// llama.cpp's substitute when the row length does not fit a 256-element block.
std::optional<DType> row_fallback(DType t) {
  switch (t) {
    case DType::q4_k: return DType::q5_0;
    case DType::q5_k: return DType::q5_1;
    case DType::q6_k: return DType::q8_0;
    case DType::q2_k: case DType::q3_k: case DType::iq4_xs:
    case DType::iq2_xxs: case DType::iq2_xs: case DType::iq2_s: case DType::iq3_xxs: case DType::iq3_s:
    case DType::iq1_s: case DType::iq1_m:
      return DType::iq4_nl;
    case DType::tq1_0: case DType::tq2_0: return DType::q4_0;
    default: return std::nullopt;
  }
}

int64_t meta_int(const gguf::GgufFile& f, const std::string& key, int64_t dflt) {
  auto v = f.get_uint(key);
  return v.ok() ? (int64_t)*v : dflt;
}

}  // namespace

const std::vector<FileType>& file_types() {
  static const std::vector<FileType> types = {
      {"Q8_0", 7, DType::q8_0, "8-bit, blocks of 32 with an F16 scale (per-group INT8)"},
      {"Q4_0", 2, DType::q4_0, "4-bit, blocks of 32, symmetric (per-group INT4)"},
      {"Q4_1", 3, DType::q4_1, "4-bit, blocks of 32, scale and min"},
      {"Q5_0", 8, DType::q5_0, "5-bit, blocks of 32, symmetric"},
      {"Q5_1", 9, DType::q5_1, "5-bit, blocks of 32, scale and min"},
      {"Q2_K", 10, DType::q2_k, "Q2_K, attn_v/attn_output/ffn_down in Q3_K"},
      {"Q3_K_S", 11, DType::q3_k, "Q3_K"},
      {"Q3_K_M", 12, DType::q3_k, "Q3_K, attn_v in Q5_K/Q4_K, ffn_down and attn_output in Q4_K"},
      {"Q3_K_L", 13, DType::q3_k, "Q3_K, attn_v/ffn_down/attn_output in Q5_K"},
      {"Q4_K_S", 14, DType::q4_k, "Q4_K, a few attn_v/ffn_down in Q5_K"},
      {"Q4_K_M", 15, DType::q4_k, "Q4_K, half of attn_v/ffn_down in Q6_K"},
      {"Q5_K_S", 16, DType::q5_k, "Q5_K"},
      {"Q5_K_M", 17, DType::q5_k, "Q5_K, half of attn_v/ffn_down in Q6_K"},
      {"Q6_K", 18, DType::q6_k, "6-bit super-blocks of 256"},
      {"IQ4_NL", 25, DType::iq4_nl, "4-bit non-linear, blocks of 32"},
      {"IQ4_XS", 30, DType::iq4_xs, "4.25-bit non-linear, super-blocks of 256 with 6-bit scales"},
      {"IQ3_M", 27, DType::iq3_s, "IQ3_S, attn_v/attn_output in Q4_K, ffn_down of the first eighth in Q4_K"},
      {"IQ3_S", 26, DType::iq3_s, "3.44 bpw lattice codebook (attn_v in Q4_K when n_head / n_head_kv >= 4)"},
      {"IQ3_XS", 22, DType::iq3_s, "IQ3_S, attn_q/attn_k and middle ffn_gate/ffn_up in IQ3_XXS"},
      {"IQ3_XXS", 23, DType::iq3_xxs, "3.06 bpw lattice codebook; attn_q/attn_k in IQ2_S, attn_output in IQ3_S"},
      {"Q2_K_S", 21, DType::q2_k, "Q2_K without the Q3_K tensors (needs an imatrix)"},
      {"IQ2_M", 29, DType::iq2_s, "2.7 bpw: IQ2_S, attn_v/attn_output/first ffn_down in IQ3_S (needs an imatrix)"},
      {"IQ2_S", 28, DType::iq2_xs, "2.5 bpw: IQ2_XS, attn_v/attn_output/first ffn_down in IQ3_S (needs an imatrix)"},
      {"IQ2_XS", 20, DType::iq2_xs, "2.31 bpw lattice codebook (needs an imatrix)"},
      {"IQ2_XXS", 19, DType::iq2_xxs, "2.06 bpw lattice codebook (needs an imatrix)"},
      {"IQ1_M", 31, DType::iq1_m, "1.75 bpw lattice codebook, attn_output in IQ2_XXS (needs an imatrix)"},
      {"IQ1_S", 24, DType::iq1_s, "1.56 bpw lattice codebook, attn_output in IQ2_XXS (needs an imatrix)"},
      {"TQ2_0", 37, DType::tq2_0, "ternary, 2.06 bpw (for ternary-trained models)"},
      {"TQ1_0", 36, DType::tq1_0, "ternary, 1.69 bpw (for ternary-trained models)"},
      {"F16", 1, DType::f16, "half precision"},
      {"BF16", 32, DType::bf16, "bfloat16"},
      {"F32", 0, DType::f32, "single precision"},
  };
  return types;
}

std::optional<FileType> find_file_type(std::string_view name) {
  std::string want = upper(name);
  if (want == "Q4_K") want = "Q4_K_M";
  if (want == "Q5_K") want = "Q5_K_M";
  if (want == "Q3_K") want = "Q3_K_M";
  for (const auto& t : file_types())
    if (t.name == want) return t;
  return std::nullopt;
}

std::string file_type_names() {
  std::string s;
  for (const auto& t : file_types()) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s + " (Q3_K, Q4_K, Q5_K: aliases of Q3_K_M, Q4_K_M, Q5_K_M)";
}

bool is_float_type(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

namespace {

// llama_ftype values of the mixes the rules below name.
enum Ft : uint32_t {
  kQ4_0 = 2, kQ5_0 = 8, kQ8_0 = 7, kQ2_K = 10, kQ3_K_S = 11, kQ3_K_M = 12, kQ3_K_L = 13, kQ4_K_S = 14,
  kQ4_K_M = 15, kQ5_K_M = 17, kIQ2_XXS = 19, kIQ2_XS = 20, kQ2_K_S = 21, kIQ3_XS = 22, kIQ3_XXS = 23,
  kIQ1_S = 24, kIQ4_NL = 25, kIQ3_S = 26, kIQ3_M = 27, kIQ2_S = 28, kIQ2_M = 29, kIQ4_XS = 30, kIQ1_M = 31,
  kTQ1_0 = 36, kTQ2_0 = 37,
};

bool one_of(uint32_t f, std::initializer_list<uint32_t> set) {
  for (uint32_t v : set)
    if (f == v) return true;
  return false;
}

struct ModelFacts {
  int64_t n_gqa = 1, n_expert = 0, n_layer = 0, n_attn_v = 0;
  bool has_output = false, has_imatrix = false;
};

// llama.cpp's llama_tensor_get_type (src/llama-quant.cpp) for one tensor of a
// dense or MoE model, before the row-length fallback.
DType tensor_type(const std::string& name, int64_t il, uint32_t f, DType type, const ModelFacts& m) {
  const bool iq_low = one_of(f, {kIQ2_XXS, kIQ2_XS, kIQ1_S, kIQ2_S, kIQ2_M, kIQ1_M});
  const bool iq2_sm = f == kIQ2_S || f == kIQ2_M;
  const int64_t n_layer = m.n_layer > 0 ? m.n_layer : 1;
  if (name == "output.weight" || (!m.has_output && name == "token_embd.weight")) {
    if (iq_low || f == kIQ3_XXS) return DType::q5_k;
    return type != DType::q8_0 ? DType::q6_k : type;
  }
  if (name == "token_embd.weight") {
    if (one_of(f, {kIQ2_XXS, kIQ2_XS, kIQ1_S, kIQ1_M})) return DType::q2_k;
    if (iq2_sm || f == kIQ3_XXS) return DType::iq3_s;
    if (f == kTQ1_0 || f == kTQ2_0) return DType::q4_k;
    return type;
  }
  if (iq_low) {
    if (contains(name, "attn_v.weight")) {
      if (m.n_gqa >= 4 || m.n_expert >= 4) return DType::q4_k;
      return iq2_sm ? DType::iq3_s : DType::q2_k;
    }
    if (m.n_expert == 8 && contains(name, "attn_k.weight")) return DType::q4_k;
    if (contains(name, "ffn_down")) return il >= 0 && il < n_layer / 8 ? (iq2_sm ? DType::iq3_s : DType::q2_k) : type;
    if (contains(name, "attn_output.weight")) {
      if (m.n_expert == 8) return DType::q5_k;
      if (f == kIQ1_S || f == kIQ1_M) return DType::iq2_xxs;
      if (iq2_sm) return DType::iq3_s;
    }
    return type;
  }
  if (contains(name, "attn_v.weight")) {
    if (f == kQ2_K) type = m.n_gqa >= 4 ? DType::q4_k : DType::q3_k;
    else if (f == kQ2_K_S && m.n_gqa >= 4) type = DType::q4_k;
    else if (f == kIQ3_XXS) type = m.n_gqa >= 4 ? DType::q4_k : !m.has_imatrix ? DType::iq3_s : DType::iq3_xxs;
    else if ((f == kIQ3_XS || f == kIQ3_S) && m.n_gqa >= 4) type = DType::q4_k;
    else if (f == kIQ3_M) type = DType::q4_k;
    else if (f == kQ3_K_M) type = il >= 0 && il < 2 ? DType::q5_k : DType::q4_k;
    else if (f == kQ3_K_L) type = DType::q5_k;
    else if ((f == kIQ4_NL || f == kIQ4_XS) && m.n_gqa >= 4) type = DType::q5_k;
    else if ((f == kQ4_K_M || f == kQ5_K_M) && il >= 0 && use_more_bits(il, m.n_attn_v)) type = DType::q6_k;
    else if (f == kQ4_K_S && il >= 0 && il < 4) type = DType::q5_k;
    if (m.n_expert == 8) type = DType::q8_0;
    return type;
  }
  if (contains(name, "attn_k.weight")) {
    if (m.n_expert == 8) return DType::q8_0;
    if (f == kIQ3_XS) return DType::iq3_xxs;
    if (f == kIQ3_XXS) return DType::iq2_s;
    return type;
  }
  if (contains(name, "attn_q.weight")) {
    if (f == kIQ3_XS) return DType::iq3_xxs;
    if (f == kIQ3_XXS) return DType::iq2_s;
    return type;
  }
  if (contains(name, "ffn_down")) {
    const bool first_eighth = il >= 0 && il < n_layer / 8;
    const bool more = il >= 0 && use_more_bits(il, n_layer);
    if (f == kQ2_K) return DType::q3_k;
    if (f == kQ2_K_S) return first_eighth ? DType::q4_k : type;
    if (f == kIQ3_XXS && !m.has_imatrix) return first_eighth ? DType::q4_k : DType::q3_k;
    if (f == kQ3_K_M) return il >= 0 && il < n_layer / 16 ? DType::q5_k : DType::q4_k;
    if (f == kIQ3_M && (first_eighth || (m.n_expert == 8 && more))) return DType::q4_k;
    if (f == kQ3_K_L) return DType::q5_k;
    if (f == kQ4_K_M) return more ? DType::q6_k : type;
    if (first_eighth && (f == kIQ4_NL || f == kIQ4_XS) && !m.has_imatrix) return DType::q5_k;
    if (f == kQ5_K_M) return more ? DType::q6_k : type;
    if (f == kQ4_K_S) return first_eighth ? DType::q5_k : type;
    if ((f == kQ4_0 || f == kQ5_0) && m.has_imatrix && first_eighth) return f == kQ4_0 ? DType::q4_1 : DType::q5_1;
    return type;
  }
  if (contains(name, "attn_output.weight")) {
    if (m.n_expert == 8) {
      if (one_of(f, {kQ2_K, kIQ3_XS, kIQ3_XXS, kQ3_K_S, kQ3_K_M, kIQ4_NL, kQ4_K_S, kQ4_K_M, kIQ3_S, kIQ3_M, kIQ4_XS}))
        return DType::q5_k;
      return type;
    }
    if (f == kQ2_K) return DType::q3_k;
    if (f == kIQ3_XXS) return DType::iq3_s;
    if (f == kQ3_K_M || f == kIQ3_M) return DType::q4_k;
    if (f == kQ3_K_L) return DType::q5_k;
    return type;
  }
  if (contains(name, "attn_qkv.weight")) {
    if (f == kQ3_K_M || f == kQ3_K_L || f == kIQ3_M) return DType::q4_k;
    if (f == kQ4_K_M) return DType::q5_k;
    if (f == kQ5_K_M) return DType::q6_k;
    return type;
  }
  if (contains(name, "ffn_gate") || contains(name, "ffn_up")) {
    if (f == kIQ3_XS && il >= n_layer / 8 && il < 7 * n_layer / 8) return DType::iq3_xxs;
    return type;
  }
  return type;
}

}  // namespace

bool needs_imatrix(const FileType& ft, const std::string& tensor, DType type) {
  switch (type) {
    case DType::iq2_xxs: case DType::iq2_xs: case DType::iq2_s: case DType::iq1_s: return true;
    case DType::iq1_m: return tensor != "token_embd.weight" && tensor != "output.weight";
    case DType::q2_k: return ft.ftype == kQ2_K_S && tensor != "token_embd.weight";
    default: return false;
  }
}

std::vector<TensorPlan> plan_tensors(const gguf::GgufFile& src, const FileType& ft, bool has_imatrix) {
  std::string arch = "llama";
  if (auto a = src.get_string("general.architecture"); a.ok()) arch = *a;
  ModelFacts m;
  const int64_t n_head = meta_int(src, arch + ".attention.head_count", 1);
  const int64_t n_head_kv = meta_int(src, arch + ".attention.head_count_kv", n_head);
  m.n_gqa = n_head_kv > 0 ? n_head / n_head_kv : 1;
  m.has_output = src.find_tensor("output.weight") != nullptr;
  m.n_expert = meta_int(src, arch + ".expert_count", 0);
  m.has_imatrix = has_imatrix;
  int64_t max_layer = -1;
  for (const auto& t : src.tensors()) {
    m.n_attn_v += contains(t.name, "attn_v.weight");
    max_layer = std::max(max_layer, layer_of(t.name));
  }
  m.n_layer = meta_int(src, arch + ".block_count", max_layer + 1);
  const bool mixes = !is_float_type(ft.base);

  std::vector<TensorPlan> plans;
  plans.reserve(src.tensors().size());
  for (const auto& t : src.tensors()) {
    TensorPlan p{t.type, false, false};
    int n_dims = 0;
    for (int64_t d : t.dims) n_dims += d > 1;
    if (!ends_with(t.name, "weight") || t.dims.size() < 2 || n_dims < 2 || contains(t.name, "ffn_gate_inp.weight")) {
      plans.push_back(p);
      continue;
    }
    DType type = ft.base;
    const int64_t nx = t.dims[0];
    if (mixes) {
      if ((t.name == "output.weight" || (!m.has_output && t.name == "token_embd.weight")) && nx % block_of(type) != 0)
        type = DType::q8_0;  // llama.cpp checks the base type's block here, before its mix rules
      else
        type = tensor_type(t.name, layer_of(t.name), ft.ftype, type, m);
    }
    if (nx % block_of(type) != 0) {
      p.fallback = true;
      auto sub = row_fallback(type);
      type = (sub && nx % block_of(*sub) == 0) ? *sub : t.type;
    }
    p.type = type;
    p.quantize = type != t.type;
    plans.push_back(p);
  }
  return plans;
}

}  // namespace serval::quant
