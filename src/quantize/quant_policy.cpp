#include "quantize/quant_policy.h"

#include <cctype>
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
    case DType::q2_k: case DType::q3_k: case DType::iq4_xs: return DType::iq4_nl;
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

bool is_read_only_file_type(std::string_view name) {
  const std::string want = upper(name);
  for (const char* n : {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M",
                        "TQ1_0", "TQ2_0"})
    if (want == n) return true;
  return false;
}

std::string file_type_names() {
  std::string s;
  for (const auto& t : file_types()) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s + " (Q3_K, Q4_K, Q5_K: aliases of Q3_K_M, Q4_K_M, Q5_K_M)";
}

bool is_float_type(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

std::vector<TensorPlan> plan_tensors(const gguf::GgufFile& src, const FileType& ft, bool has_imatrix) {
  std::string arch = "llama";
  if (auto a = src.get_string("general.architecture"); a.ok()) arch = *a;
  const int64_t n_head = meta_int(src, arch + ".attention.head_count", 1);
  const int64_t n_head_kv = meta_int(src, arch + ".attention.head_count_kv", n_head);
  const int64_t n_gqa = n_head_kv > 0 ? n_head / n_head_kv : 1;
  const bool has_output = src.find_tensor("output.weight") != nullptr;
  // Mixture of experts (llama.cpp's llama_tensor_get_type): the router stays
  // as it is; with 8 experts attn_k and attn_v take Q8_0 and attn_output Q5_K
  // for the K-quant and IQ4 mixes.
  const int64_t n_expert = meta_int(src, arch + ".expert_count", 0);
  const bool eight_experts = n_expert == 8;
  int64_t n_attn_v = 0, n_ffn_down = 0;
  for (const auto& t : src.tensors()) {
    n_attn_v += contains(t.name, "attn_v.weight");
    n_ffn_down += contains(t.name, "ffn_down");
  }
  const bool mixes = !is_float_type(ft.base);
  const uint32_t f = ft.ftype;
  const bool q4_k_m = f == 15, q5_k_m = f == 17, q4_k_s = f == 14, iq4_nl = f == 25 || f == 30;  // IQ4_NL, IQ4_XS
  const bool q2_k = f == 10, q3_k_m = f == 12, q3_k_l = f == 13;

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
      const int64_t il = layer_of(t.name);
      if (t.name == "output.weight" || (!has_output && t.name == "token_embd.weight")) {
        if (nx % block_of(type) != 0) type = DType::q8_0;
        else if (type != DType::q8_0) type = DType::q6_k;
      } else if (eight_experts && (contains(t.name, "attn_v.weight") || contains(t.name, "attn_k.weight"))) {
        type = DType::q8_0;
      } else if (contains(t.name, "attn_v.weight")) {
        if (q2_k) type = n_gqa >= 4 ? DType::q4_k : DType::q3_k;
        else if (q3_k_m) type = il >= 0 && il < 2 ? DType::q5_k : DType::q4_k;
        else if (q3_k_l) type = DType::q5_k;
        else if (iq4_nl && n_gqa >= 4) type = DType::q5_k;
        else if ((q4_k_m || q5_k_m) && il >= 0 && use_more_bits(il, n_attn_v)) type = DType::q6_k;
        else if (q4_k_s && il >= 0 && il < 4) type = DType::q5_k;
      } else if (contains(t.name, "ffn_down")) {
        const bool first_eighth = il >= 0 && il < n_ffn_down / 8;
        if (q2_k) type = DType::q3_k;
        else if (q3_k_m) type = il >= 0 && il < n_ffn_down / 16 ? DType::q5_k : DType::q4_k;
        else if (q3_k_l) type = DType::q5_k;
        else if ((q4_k_m || q5_k_m) && il >= 0 && use_more_bits(il, n_ffn_down)) type = DType::q6_k;
        else if (iq4_nl && first_eighth && !has_imatrix) type = DType::q5_k;
        else if (q4_k_s && first_eighth) type = DType::q5_k;
        else if ((f == 2 || f == 8) && has_imatrix && first_eighth) type = f == 2 ? DType::q4_1 : DType::q5_1;
      } else if (contains(t.name, "attn_output.weight")) {
        if (eight_experts && (q2_k || q4_k_s || q4_k_m || iq4_nl || f == 11 || f == 12 || f == 13)) type = DType::q5_k;
        else if (q2_k) type = DType::q3_k;
        else if (q3_k_m) type = DType::q4_k;
        else if (q3_k_l) type = DType::q5_k;
      } else if (contains(t.name, "attn_qkv.weight")) {
        if (q3_k_m || q3_k_l) type = DType::q4_k;
        else if (q4_k_m) type = DType::q5_k;
        else if (q5_k_m) type = DType::q6_k;
      }
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
