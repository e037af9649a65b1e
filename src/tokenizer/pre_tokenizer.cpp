#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 32
#include <pcre2.h>

#include <cstdio>

#include "tokenizer/unicode.h"

namespace serval {

namespace {

// ---------------------------------------------------------------------------
// The regexes, as written in the models' tokenizer.json files. Where the
// original uses (?i:...) or \p{Lu}-style classes it is rewritten with plain
// classes and lookaheads (the same rewrites llama.cpp uses), since the
// collapsed subject only knows the category groups.

constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Non-ASCII characters are written as \x{..} escapes: the exact code points
// matter (e.g. U+212A KELVIN SIGN, not its canonical equivalent "K"), and
// editors and tools are free to normalise literal text.
//
// DeepSeek LLM: explicit letter ranges of the original tokenizer.json.
constexpr const char* kDeepseekLlmLetters =
    "\\s?["
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}"
    "]+";
constexpr const char* kDeepseekLlmPunct = "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+";
constexpr const char* kDeepseekCjk = "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";

constexpr const char* kDeepseekV3Main =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr const char* kPoro = " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+";

constexpr const char* kTekken =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr const char* kGpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr const char* kBailingMoe =
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";

constexpr const char* kSeedCoder =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}"
    "| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum class Family {
  default_, gpt2, llama3, qwen2, deepseek_llm, deepseek_v3, deepseek_coder, falcon, starcoder, poro, viking,
  tekken, chameleon, gpt4o, superbpe, bailingmoe, seed_coder,
};

std::vector<std::string> family_regexes(Family f) {
  switch (f) {
    case Family::default_:
      return {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
    case Family::gpt2:
      return {kGpt2};
    case Family::llama3:
      return {kLlama3};
    case Family::qwen2:
      return {kQwen2};
    case Family::deepseek_llm:
      // "\s++$" is the original "\s+$" made possessive: same matches (the
      // run must reach the end either way) without quadratic backtracking on
      // long runs of spaces that do not.
      return {"[\\r\\n]", kDeepseekLlmLetters, kDeepseekLlmPunct, "\\s++$", kDeepseekCjk, "\\p{N}+"};
    case Family::deepseek_v3:
      return {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+", kDeepseekV3Main};
    case Family::deepseek_coder:
      return {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kDeepseekCjk, "\\p{N}"};
    case Family::falcon:
      return {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"};
    case Family::starcoder:
      return {"\\p{N}", kGpt2};
    case Family::poro:
      return {kPoro};
    case Family::viking:
      return {kPoro, "\\p{N}"};
    case Family::tekken:
      return {kTekken};
    case Family::chameleon:
      return {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
              "[\\p{P}!-/:-@\\[-`{-~]", kGpt2};
    case Family::gpt4o:
      return {kGpt4o};
    case Family::superbpe:
      // The second regex matches only empty strings: it cuts digit runs into
      // groups of three counted from the right.
      return {"\\p{N}+", "(?=(\\d{3})+(?!\\d))"};
    case Family::bailingmoe:
      return {kBailingMoe};
    case Family::seed_coder:
      return {kSeedCoder};
  }
  return {};
}

struct NameEntry {
  const char* name;
  Family family;
  bool clean_spaces;
  bool ignore_merges;
  int add_bos;  // -1: vocab-type default, 0/1: override
  bool no_bos;
  bool add_sep;
};

// tokenizer.ggml.pre values (as written by llama.cpp's convert_hf_to_gguf.py)
// and the flags llama.cpp's loader attaches to them.
constexpr NameEntry kNames[] = {
    {"default", Family::default_, true, false, -1, false, false},
    {"llama3", Family::llama3, true, true, 1, false, false},
    {"llama-v3", Family::llama3, true, true, 1, false, false},
    {"llama-bpe", Family::llama3, true, true, 1, false, false},
    {"falcon3", Family::llama3, true, true, 1, false, false},
    {"falcon-h1", Family::llama3, true, true, 1, false, false},
    {"pixtral", Family::llama3, true, true, 1, false, false},
    {"midm-2.0", Family::llama3, true, true, 1, false, false},
    {"lfm2", Family::llama3, true, true, 1, false, false},
    {"dbrx", Family::llama3, true, false, -1, false, false},
    {"smaug-bpe", Family::llama3, true, false, -1, false, false},
    {"chatglm-bpe", Family::llama3, true, false, -1, true, false},
    {"glm4", Family::llama3, true, false, -1, true, false},
    {"deepseek-llm", Family::deepseek_llm, false, false, -1, false, false},
    {"deepseek-coder", Family::deepseek_coder, false, false, -1, false, false},
    {"deepseek-v3", Family::deepseek_v3, false, false, -1, false, false},
    {"hunyuan-dense", Family::deepseek_v3, false, false, -1, false, false},
    {"falcon", Family::falcon, true, false, -1, false, false},
    {"mpt", Family::gpt2, true, false, -1, false, false},
    {"gpt-2", Family::gpt2, true, false, -1, false, false},
    {"phi-2", Family::gpt2, true, false, -1, false, false},
    {"jina-es", Family::gpt2, true, false, -1, false, false},
    {"jina-de", Family::gpt2, true, false, -1, false, false},
    {"gigachat", Family::gpt2, true, false, -1, false, false},
    {"jina-v2-es", Family::gpt2, true, false, -1, false, false},
    {"jina-v2-de", Family::gpt2, true, false, -1, false, false},
    {"a.x-4.0", Family::gpt2, true, false, -1, false, false},
    {"mellum", Family::gpt2, true, false, -1, false, false},
    {"olmo", Family::gpt2, true, false, -1, false, false},
    {"jais", Family::gpt2, true, false, -1, false, false},
    {"exaone4", Family::gpt2, true, false, -1, false, false},
    {"trillion", Family::gpt2, false, false, -1, false, false},
    {"granite-docling", Family::gpt2, false, false, -1, false, false},
    {"jina-v1-en", Family::gpt2, true, false, -1, false, true},
    {"jina-v2-code", Family::gpt2, true, false, -1, false, true},
    {"roberta-bpe", Family::gpt2, true, false, -1, false, true},
    {"starcoder", Family::starcoder, true, false, -1, false, false},
    {"refact", Family::starcoder, true, false, -1, false, false},
    {"codeshell", Family::starcoder, true, false, -1, false, false},
    {"exaone", Family::starcoder, true, false, -1, false, false},
    {"minerva-7b", Family::starcoder, true, false, -1, false, false},
    {"command-r", Family::starcoder, false, false, -1, false, false},
    {"smollm", Family::starcoder, false, false, -1, false, false},
    {"qwen2", Family::qwen2, false, false, -1, false, false},
    {"deepseek-r1-qwen", Family::qwen2, false, false, -1, false, false},
    {"kormo", Family::qwen2, false, false, -1, false, false},
    {"hunyuan", Family::qwen2, false, false, -1, false, false},
    {"grok-2", Family::qwen2, false, false, -1, false, false},
    {"stablelm2", Family::qwen2, true, false, -1, false, false},
    {"megrez", Family::qwen2, true, false, -1, false, false},
    {"poro-chat", Family::poro, false, false, -1, false, false},
    {"bloom", Family::poro, true, false, -1, false, false},
    {"gpt3-finnish", Family::poro, true, false, -1, false, false},
    {"viking", Family::viking, false, false, -1, false, false},
    {"tekken", Family::tekken, false, true, 1, false, false},
    {"chameleon", Family::chameleon, false, false, 1, false, false},
    {"gpt-4o", Family::gpt4o, false, false, -1, false, false},
    {"llama4", Family::gpt4o, false, false, -1, false, false},
    {"minimax-m2", Family::gpt4o, false, false, -1, false, false},
    {"superbpe", Family::superbpe, false, false, -1, false, false},
    {"bailingmoe", Family::bailingmoe, false, false, -1, false, false},
    {"bailingmoe2", Family::bailingmoe, false, false, -1, false, false},
    {"llada-moe", Family::bailingmoe, false, false, -1, false, false},
    {"seed-coder", Family::seed_coder, false, false, -1, false, false},
};

// ---------------------------------------------------------------------------
// Subject encoding.

// Codes of the collapsed subject for non-ASCII code points. They are above
// ASCII, so ASCII characters (kept as themselves) never collide with them.
constexpr uint32_t kCodeOther = 0xD0;
constexpr uint32_t kCodeNumber = 0xD1;
constexpr uint32_t kCodeLetter = 0xD2;
constexpr uint32_t kCodePunct = 0xD3;
constexpr uint32_t kCodeMark = 0xD4;
constexpr uint32_t kCodeSymbol = 0xD5;
// Non-ASCII whitespace becomes a vertical tab, which PCRE2's \s matches.
constexpr uint32_t kCodeSpace = 0x0B;

uint32_t collapse(uint32_t cp) {
  if (cp < 128) return cp;
  if (unicode::is_whitespace(cp)) return kCodeSpace;
  switch (unicode::category(cp)) {
    case unicode::Category::L: return kCodeLetter;
    case unicode::Category::N: return kCodeNumber;
    case unicode::Category::P: return kCodePunct;
    case unicode::Category::M: return kCodeMark;
    case unicode::Category::S: return kCodeSymbol;
    default: return kCodeOther;
  }
}

uint32_t raw(uint32_t cp) { return (cp >= 128 && unicode::is_whitespace(cp)) ? kCodeSpace : cp; }

void append_hex_escape(std::string& out, uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\x{%X}", cp);
  out += buf;
}

// The members of a category class in the collapsed encoding: its code plus
// the ASCII characters of that category.
std::string category_members(unicode::Category cat, uint32_t code) {
  std::string s;
  append_hex_escape(s, code);
  for (uint32_t c = 0; c < 128; ++c) {
    if (unicode::category(c) == cat && !unicode::is_whitespace(c)) append_hex_escape(s, c);
  }
  return s;
}

}  // namespace

Expected<PreTokenizerSpec> lookup_pre_tokenizer(std::string_view name) {
  if (name.empty()) name = "default";
  if (name == "kimi-k2" || name == "afmoe") {
    return unsupported("tokenizer.ggml.pre '" + std::string(name) +
                       "' needs a hand-written pre-tokenizer that serval does not have");
  }
  for (const NameEntry& e : kNames) {
    if (name != e.name) continue;
    PreTokenizerSpec spec;
    spec.name = e.name;
    spec.regexes = family_regexes(e.family);
    spec.clean_spaces = e.clean_spaces;
    spec.ignore_merges = e.ignore_merges;
    if (e.add_bos >= 0) spec.add_bos = (e.add_bos == 1);
    spec.no_bos = e.no_bos;
    spec.add_sep = e.add_sep;
    return spec;
  }
  return unsupported("unknown tokenizer.ggml.pre '" + std::string(name) + "'");
}

Expected<std::string> translate_regex(std::string_view re, bool& collapsed) {
  collapsed = re.find("\\p{") != std::string_view::npos;
  std::string out;
  bool in_class = false;
  size_t pos = 0;
  while (pos < re.size()) {
    const uint32_t cp = unicode::decode_utf8(re, pos);
    if (cp == '\\') {
      if (pos >= re.size()) return invalid_argument("regex ends with a backslash: " + std::string(re));
      if (re[pos] == 'p' && pos + 1 < re.size() && re[pos + 1] == '{') {
        const size_t close = re.find('}', pos);
        if (close == std::string_view::npos) return invalid_argument("unterminated \\p{ in regex");
        const std::string_view name = re.substr(pos + 2, close - pos - 2);
        pos = close + 1;
        std::string members;
        if (name == "L") members = category_members(unicode::Category::L, kCodeLetter);
        else if (name == "N") members = category_members(unicode::Category::N, kCodeNumber);
        else if (name == "P") members = category_members(unicode::Category::P, kCodePunct);
        else if (name == "M") members = category_members(unicode::Category::M, kCodeMark);
        else if (name == "S") members = category_members(unicode::Category::S, kCodeSymbol);
        else return unsupported("regex class \\p{" + std::string(name) + "} is not supported");
        out += in_class ? members : "[" + members + "]";
        continue;
      }
      const uint32_t esc = unicode::decode_utf8(re, pos);
      if (esc >= 128) {
        append_hex_escape(out, esc);  // an escaped literal character
      } else {
        out += '\\';
        out += static_cast<char>(esc);
      }
      continue;
    }
    if (cp >= 128) {
      if (collapsed) {
        return invalid_argument("regex mixes \\p{..} classes with non-ASCII characters: " + std::string(re));
      }
      append_hex_escape(out, cp);
      continue;
    }
    if (cp == '[' && !in_class) in_class = true;
    else if (cp == ']' && in_class) in_class = false;
    out += static_cast<char>(cp);
  }
  return out;
}

// ---------------------------------------------------------------------------

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool collapsed = false;
  ~Regex() { pcre2_code_free(code); }
};

Expected<PreTokenizer> PreTokenizer::create(const std::vector<std::string>& regexes) {
  PreTokenizer p;
  for (const std::string& re : regexes) {
    bool collapsed = false;
    Expected<std::string> translated = translate_regex(re, collapsed);
    if (!translated.ok()) return translated.status();
    int err = 0;
    PCRE2_SIZE err_off = 0;
    const std::string& pat = translated.value();
    // Not UTF/UCP: code units are code points (or category codes) and \s, \d
    // are ASCII-only, which is exactly what the encodings above expect.
    // DOLLAR_ENDONLY: '$' means the end of the piece, never "before a final \n".
    std::vector<PCRE2_UCHAR32> units(pat.begin(), pat.end());
    pcre2_code* code = pcre2_compile(units.data(), units.size(), PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR32 msg[256];
      pcre2_get_error_message(err, msg, 256);
      std::string m;
      for (size_t i = 0; i < 256 && msg[i] != 0; ++i) m += static_cast<char>(msg[i] < 128 ? msg[i] : '?');
      return invalid_argument("pre-tokenizer regex '" + re + "' does not compile at offset " +
                              std::to_string(err_off) + ": " + m);
    }
    // JIT is an optimisation only; without it pcre2_match interprets.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    auto r = std::make_shared<Regex>();
    r->code = code;
    r->collapsed = collapsed;
    (collapsed ? p.any_collapsed_ : p.any_raw_) = true;
    p.regexes_.push_back(std::move(r));
  }
  return p;
}

namespace {

// Per-call PCRE2 state: split() may run on many threads at once.
class MatchState {
 public:
  MatchState() {
    mctx_ = pcre2_match_context_create(nullptr);
    stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (mctx_ && stack_) pcre2_jit_stack_assign(mctx_, nullptr, stack_);
    // One ovector pair is enough: only the whole match is used (with more
    // capture groups pcre2_match returns 0 but still fills pair 0).
    md_ = pcre2_match_data_create(1, nullptr);
  }
  ~MatchState() {
    pcre2_match_data_free(md_);
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(mctx_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;

  // Finds the first match in subject[0, len) at or after `start`. Returns false
  // when there is none (or PCRE2 gives up, which only pathological input can
  // cause: the rest of the piece then stays one piece).
  bool match(const pcre2_code* code, const uint32_t* subject, size_t len, size_t start, uint32_t options,
             size_t& m0, size_t& m1) {
    if (md_ == nullptr) return false;
    int rc = pcre2_match(code, subject, len, start, options, md_, mctx_);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      rc = pcre2_match(code, subject, len, start, options | PCRE2_NO_JIT, md_, mctx_);
    }
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_);
    m0 = ov[0];
    m1 = ov[1];
    return m1 >= m0;  // \K could make them cross; treat as no match
  }

 private:
  pcre2_match_context* mctx_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
  pcre2_match_data* md_ = nullptr;
};

// Splits each piece (a length in code units) with one regex; pieces are
// consecutive in `subject`. Matches and the gaps between them become pieces.
// Empty matches only cut (like std::regex_iterator: after an empty match the
// search retries a non-empty match at the same place, then moves on by one).
std::vector<size_t> split_pieces(MatchState& st, const pcre2_code* code, const std::vector<uint32_t>& subject,
                                 const std::vector<size_t>& pieces) {
  std::vector<size_t> out;
  out.reserve(pieces.size());
  size_t base = 0;
  for (const size_t len : pieces) {
    const uint32_t* s = subject.data() + base;
    size_t pos = 0;
    size_t prev_end = 0;
    auto cut = [&](size_t m0, size_t m1) {
      if (m0 > prev_end) out.push_back(m0 - prev_end);
      if (m1 > m0) out.push_back(m1 - m0);
      prev_end = m1;
    };
    size_t m0 = 0, m1 = 0;
    while (pos <= len && st.match(code, s, len, pos, 0, m0, m1)) {
      cut(m0, m1);
      if (m1 > m0) {
        pos = m1;
        continue;
      }
      if (st.match(code, s, len, m1, PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED, m0, m1)) {
        cut(m0, m1);
        pos = m1;
        continue;
      }
      pos = m1 + 1;
    }
    if (prev_end < len) out.push_back(len - prev_end);
    base += len;
  }
  return out;
}

}  // namespace

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  const std::vector<uint32_t> cpts = unicode::utf8_to_codepoints(text);
  if (cpts.empty()) return {};

  std::vector<uint32_t> collapsed_subject;
  std::vector<uint32_t> raw_subject;
  if (any_collapsed_) {
    collapsed_subject.resize(cpts.size());
    for (size_t i = 0; i < cpts.size(); ++i) collapsed_subject[i] = collapse(cpts[i]);
  }
  if (any_raw_) {
    raw_subject.resize(cpts.size());
    for (size_t i = 0; i < cpts.size(); ++i) raw_subject[i] = raw(cpts[i]);
  }

  std::vector<size_t> pieces = {cpts.size()};
  MatchState st;
  for (const auto& r : regexes_) {
    pieces = split_pieces(st, r->code, r->collapsed ? collapsed_subject : raw_subject, pieces);
  }

  std::vector<std::string> words;
  words.reserve(pieces.size());
  size_t start = 0;
  for (const size_t len : pieces) {
    std::string w;
    for (size_t i = start; i < start + len; ++i) unicode::append_utf8(w, cpts[i]);
    words.push_back(std::move(w));
    start += len;
  }
  return words;
}

}  // namespace serval
