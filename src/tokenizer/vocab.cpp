#include "tokenizer/vocab.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>

#include "tokenizer/detokenizer.h"

namespace serval {

namespace {

constexpr const char* kKeyModel = "tokenizer.ggml.model";
constexpr const char* kKeyPre = "tokenizer.ggml.pre";
constexpr const char* kKeyTokens = "tokenizer.ggml.tokens";
constexpr const char* kKeyScores = "tokenizer.ggml.scores";
constexpr const char* kKeyTokenType = "tokenizer.ggml.token_type";

// GGUF token_type values (llama.cpp's llama_token_type).
enum : int64_t { kTypeUndefined = 0, kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3,
                 kTypeUserDefined = 4, kTypeUnused = 5, kTypeByte = 6 };

uint32_t attr_from_type(int64_t t) {
  switch (t) {
    case kTypeNormal: return token_attr::normal;
    case kTypeUnknown: return token_attr::unknown;
    case kTypeControl: return token_attr::control;
    case kTypeUserDefined: return token_attr::user_defined;
    case kTypeUnused: return token_attr::unused;
    case kTypeByte: return token_attr::byte;
    default: return token_attr::undefined;
  }
}

bool as_int64(const gguf::Value& v, int64_t& out) {
  return std::visit(
      [&](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_same_v<T, uint64_t>) {
            if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
          }
          out = static_cast<int64_t>(x);
          return true;
        } else {
          return false;
        }
      },
      v.v);
}

std::string length_mismatch(const char* key, size_t expected, size_t actual) {
  return "metadata key '" + std::string(key) + "': expected " + std::to_string(expected) +
         " elements (one per token in " + kKeyTokens + "), got " + std::to_string(actual);
}

// An optional array: nullptr when absent; an error when present but malformed.
Expected<const gguf::Array*> optional_array(const gguf::GgufFile& f, const char* key) {
  if (!f.has(key)) return static_cast<const gguf::Array*>(nullptr);
  return f.get_array(key, gguf::ValueType::array);
}

// Optional bool: leaves `out` unchanged when absent.
Status read_bool(const gguf::GgufFile& f, const char* key, bool& out) {
  if (!f.has(key)) return Status::ok_status();
  Expected<bool> b = f.get_bool(key);
  if (!b.ok()) return b.status();
  out = b.value();
  return Status::ok_status();
}

// Optional special token id. Leaves `id` unchanged when absent. -1 and
// 0xFFFFFFFF (what converters write for "none") clear it. Anything else must
// be a valid token id.
Status read_special_id(const gguf::GgufFile& f, const char* key, int32_t n_tokens, TokenId& id) {
  if (!f.has(key)) return Status::ok_status();
  Expected<int64_t> v = f.get_int(key);
  if (!v.ok()) return v.status();
  const int64_t x = v.value();
  if (x == -1 || x == 0xFFFFFFFFll) {
    id = kNoToken;
    return Status::ok_status();
  }
  if (x < 0 || x >= n_tokens) {
    return invalid_file("metadata key '" + std::string(key) + "': expected a token id in [0, " +
                        std::to_string(n_tokens) + ") (the size of " + kKeyTokens + "), got " + std::to_string(x));
  }
  id = static_cast<TokenId>(x);
  return Status::ok_status();
}

std::string lowercase(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Type defaults (llama.cpp's, for files that do not say).
void set_type_defaults(Vocab& v) {
  switch (v.type) {
    case VocabType::spm:
      v.bos = 1; v.eos = 2; v.unk = 0;
      v.add_bos = true; v.add_eos = false; v.add_space_prefix = true; v.clean_spaces = false;
      break;
    case VocabType::wpm:
      v.bos = 101; v.unk = 100; v.sep = 102; v.pad = 0; v.mask = 103;  // BERT: [CLS] [UNK] [SEP] [PAD] [MASK]
      v.add_bos = true; v.add_eos = false; v.add_sep = true; v.clean_spaces = true;
      break;
    case VocabType::bpe:
      v.bos = 11; v.eos = 11;  // llama.cpp's historical default
      v.add_bos = false; v.add_eos = false; v.clean_spaces = v.pre_spec.clean_spaces;
      v.ignore_merges = v.pre_spec.ignore_merges;
      v.add_sep = v.pre_spec.add_sep;
      if (v.pre_spec.add_bos) v.add_bos = *v.pre_spec.add_bos;
      if (v.pre_spec.no_bos) v.bos = kNoToken;
      break;
  }
}

Status read_tokens(const gguf::GgufFile& f, Vocab& v) {
  if (!f.has(kKeyTokens)) return invalid_file(std::string("metadata key '") + kKeyTokens + "' is missing");
  Expected<const gguf::Array*> toks = f.get_array(kKeyTokens, gguf::ValueType::string);
  if (!toks.ok()) return toks.status();
  const auto& items = toks.value()->items;
  if (items.empty()) return invalid_file(std::string("metadata key '") + kKeyTokens + "': expected at least 1 token, got 0");
  if (items.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_file(std::string("metadata key '") + kKeyTokens + "': " + std::to_string(items.size()) +
                        " tokens do not fit in a 32-bit token id");
  }
  const size_t n = items.size();

  Expected<const gguf::Array*> scores = optional_array(f, kKeyScores);
  if (!scores.ok()) return scores.status();
  if (scores.value() != nullptr) {
    const gguf::Array& a = *scores.value();
    if (a.elem_type != gguf::ValueType::f32 && a.elem_type != gguf::ValueType::f64) {
      return invalid_file(std::string("metadata key '") + kKeyScores + "': expected an array of f32, got an array of " +
                          std::string(gguf::value_type_name(a.elem_type)));
    }
    if (a.items.size() != n) return invalid_file(length_mismatch(kKeyScores, n, a.items.size()));
  }
  Expected<const gguf::Array*> types = optional_array(f, kKeyTokenType);
  if (!types.ok()) return types.status();
  if (types.value() != nullptr) {
    const gguf::Array& a = *types.value();
    int64_t probe = 0;
    if (!a.items.empty() && !as_int64(a.items[0], probe)) {
      return invalid_file(std::string("metadata key '") + kKeyTokenType +
                          "': expected an array of integers, got an array of " +
                          std::string(gguf::value_type_name(a.elem_type)));
    }
    if (a.items.size() != n) return invalid_file(length_mismatch(kKeyTokenType, n, a.items.size()));
  }

  v.tokens.resize(n);
  v.text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v.tokens[i];
    t.text = std::get<std::string>(items[i].v);
    // An empty text would match everywhere when special tokens are split out.
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";
    if (scores.value() != nullptr) {
      const gguf::Value& s = scores.value()->items[i];
      t.score = s.type() == gguf::ValueType::f32 ? std::get<float>(s.v) : static_cast<float>(std::get<double>(s.v));
    }
    if (types.value() != nullptr) {
      int64_t tt = 0;
      as_int64(types.value()->items[i], tt);
      t.attr = attr_from_type(tt);
      // A byte token stands for one byte: "<0x-1>" or "<0x100>" would make
      // byte fallback and rendering guess. Refuse the file instead.
      if ((t.attr & token_attr::byte) && parse_byte_token(t.text) < 0) {
        return invalid_file(std::string("metadata key '") + kKeyTokens + "': token " + std::to_string(i) + " '" +
                            t.text + "' has type BYTE but is not of the form <0xHH>");
      }
    }
    auto [it, inserted] = v.text_to_id.emplace(t.text, static_cast<TokenId>(i));
    if (!inserted) {
      return invalid_file(std::string("metadata key '") + kKeyTokens + "': token text '" + t.text +
                          "' appears twice (ids " + std::to_string(it->second) + " and " + std::to_string(i) + ")");
    }
    v.max_token_len = std::max(v.max_token_len, t.text.size());
  }
  return Status::ok_status();
}

void mark_control(Vocab& v, TokenId id) {
  // llama.cpp forces end-of-turn/FIM-looking tokens to control, so that they
  // are not rendered and not split out of text without parse_special.
  if (!(v.tokens[id].attr & token_attr::control)) v.tokens[id].attr = token_attr::control;
}

// Tokens recognised by their text when the metadata does not name them.
void detect_special_by_text(Vocab& v) {
  struct Rule {
    TokenId* slot;
    std::vector<std::string_view> texts;
  };
  const std::vector<Rule> rules = {
      {&v.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
                "<｜end▁of▁sentence｜>"}},
      {&v.eom, {"<|eom_id|>"}},
      {&v.fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<｜fim▁begin｜>", "<PRE>"}},
      {&v.fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<｜fim▁hole｜>", "<SUF>"}},
      {&v.fim_mid, {"<|fim_middle|>", "<fim-middle>", "<｜fim▁end｜>", "<MID>"}},
      {&v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<PAD>"}},
      {&v.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"}},
      {&v.fim_sep, {"<|file_sep|>"}},
  };
  for (const Rule& r : rules) {
    if (*r.slot != kNoToken) continue;
    // Lowest id wins when several texts are present (deterministic).
    TokenId best = kNoToken;
    for (std::string_view t : r.texts) {
      const TokenId id = v.find(t);
      if (id != kNoToken && (best == kNoToken || id < best)) best = id;
    }
    if (best != kNoToken) {
      *r.slot = best;
      mark_control(v, best);
    }
  }

  // End of generation: FIM pad/repo/sep, end-of-turn-looking texts, eos/eot/eom.
  std::vector<TokenId> eog;
  for (TokenId id : {v.fim_pad, v.fim_rep, v.fim_sep, v.eos, v.eot, v.eom}) {
    if (id != kNoToken) eog.push_back(id);
  }
  for (std::string_view t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                             "<|eom_id|>", "<EOT>"}) {
    const TokenId id = v.find(t);
    if (id != kNoToken) {
      eog.push_back(id);
      mark_control(v, id);
    }
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  v.eog = std::move(eog);
}

void build_special_list(Vocab& v) {
  constexpr uint32_t kSplit = token_attr::control | token_attr::unknown | token_attr::user_defined;
  for (TokenId id = 0; id < v.n_tokens(); ++id) {
    if (v.attr(id) & kSplit) v.special_by_length.push_back(id);
  }
  std::stable_sort(v.special_by_length.begin(), v.special_by_length.end(), [&](TokenId a, TokenId b) {
    return v.tokens[a].text.size() > v.tokens[b].text.size();
  });
}

// Per-model attribute fixes that GGUF files cannot express (llama.cpp's list).
void apply_model_quirks(const gguf::GgufFile& f, Vocab& v) {
  std::string name;
  if (f.has("general.name")) {
    Expected<std::string> n = f.get_string("general.name");
    if (n.ok()) name = lowercase(n.value());
  }
  auto set = [&](std::string_view text, uint32_t a, bool on) {
    const TokenId id = v.find(text);
    if (id == kNoToken) return;
    v.tokens[id].attr = on ? (v.tokens[id].attr | a) : (v.tokens[id].attr & ~a);
  };
  const std::string& pre = v.pre;
  if (pre.find("jina-v2-de") != std::string::npos || pre.find("jina-v2-es") != std::string::npos ||
      pre.find("jina-v2-code") != std::string::npos) {
    set("<mask>", token_attr::lstrip, true);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (TokenId id : v.special_by_length) v.tokens[id].attr |= token_attr::rstrip;
    set("</s>", token_attr::rstrip, true);
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, token_attr::rstrip, false);
  }
}

}  // namespace

Expected<Vocab> load_vocab(const gguf::GgufFile& f) {
  Vocab v;
  if (!f.has(kKeyModel)) return invalid_file(std::string("metadata key '") + kKeyModel + "' is missing");
  Expected<std::string> model = f.get_string(kKeyModel);
  if (!model.ok()) return model.status();
  v.model = model.value();
  if (v.model == "llama") {
    v.type = VocabType::spm;
  } else if (v.model == "gpt2") {
    v.type = VocabType::bpe;
  } else if (v.model == "bert") {
    v.type = VocabType::wpm;
  } else {
    return unsupported(std::string("metadata key '") + kKeyModel + "': tokenizer model '" + v.model +
                       "' is not supported (supported: llama, gpt2, bert)");
  }
  if (f.has(kKeyPre)) {
    Expected<std::string> pre = f.get_string(kKeyPre);
    if (!pre.ok()) return pre.status();
    v.pre = pre.value();
  }
  if (v.type == VocabType::bpe) {
    Expected<PreTokenizerSpec> spec = lookup_pre_tokenizer(v.pre);
    if (!spec.ok()) return spec.status();
    v.pre_spec = std::move(spec.value());
  }

  SERVAL_RETURN_IF_ERROR(read_tokens(f, v));
  const int32_t n = v.n_tokens();

  set_type_defaults(v);
  // Defaults that do not fit this vocabulary are dropped (only explicit
  // metadata values out of range are errors).
  for (TokenId* id : {&v.bos, &v.eos, &v.unk, &v.sep, &v.pad, &v.mask}) {
    if (*id >= n) *id = kNoToken;
  }

  struct Key {
    const char* key;
    TokenId* id;
  };
  const Key keys[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},
      {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},
      {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},
      {"tokenizer.ggml.seperator_token_id", &v.sep},  // sic: the key is misspelt in GGUF
      {"tokenizer.ggml.padding_token_id", &v.pad},
      {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.fim_pre_token_id", &v.fim_pre},
      {"tokenizer.ggml.fim_suf_token_id", &v.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v.fim_mid},
      {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v.fim_pre},  // older names of the FIM ids
      {"tokenizer.ggml.suffix_token_id", &v.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.fim_mid},
  };
  for (const Key& k : keys) SERVAL_RETURN_IF_ERROR(read_special_id(f, k.key, n, *k.id));
  // BERT converters store [CLS] as cls_token_id; it plays the role of BOS.
  if (v.type == VocabType::wpm && !f.has("tokenizer.ggml.bos_token_id")) {
    SERVAL_RETURN_IF_ERROR(read_special_id(f, "tokenizer.ggml.cls_token_id", n, v.bos));
  } else {
    TokenId cls = kNoToken;  // validated even when unused
    SERVAL_RETURN_IF_ERROR(read_special_id(f, "tokenizer.ggml.cls_token_id", n, cls));
  }

  SERVAL_RETURN_IF_ERROR(read_bool(f, "tokenizer.ggml.add_bos_token", v.add_bos));
  SERVAL_RETURN_IF_ERROR(read_bool(f, "tokenizer.ggml.add_eos_token", v.add_eos));
  SERVAL_RETURN_IF_ERROR(read_bool(f, "tokenizer.ggml.add_sep_token", v.add_sep));
  SERVAL_RETURN_IF_ERROR(read_bool(f, "tokenizer.ggml.add_space_prefix", v.add_space_prefix));
  // Asking for a token the model does not have means not adding it.
  v.add_bos = v.add_bos && v.bos != kNoToken;
  v.add_eos = v.add_eos && v.eos != kNoToken;
  v.add_sep = v.add_sep && v.sep != kNoToken;

  detect_special_by_text(v);
  build_special_list(v);
  apply_model_quirks(f, v);
  return v;
}

}  // namespace serval
