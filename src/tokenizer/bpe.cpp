#include "tokenizer/bpe.h"
#include "tokenizer/symbol_merge.h"

#include <queue>

#include "tokenizer/unicode.h"

namespace serval {

namespace {

constexpr char kSep = '\xff';

using Symbol = tokenizer_detail::MergeSymbol;
using Candidate = tokenizer_detail::MergeCandidate<int32_t>;

struct WorseCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.priority != b.priority) return a.priority > b.priority;  // lowest rank first
    return a.left > b.left;                        // then leftmost
  }
};

}  // namespace

Expected<BpeModel> BpeModel::load(const gguf::GgufFile& f) {
  constexpr const char* kKey = "tokenizer.ggml.merges";
  if (!f.has(kKey)) {
    return invalid_file(std::string("metadata key '") + kKey + "' is missing (required for tokenizer model gpt2)");
  }
  Expected<const gguf::Array*> merges = f.get_array(kKey, gguf::ValueType::string);
  if (!merges.ok()) return merges.status();
  BpeModel m;
  const auto& items = merges.value()->items;
  m.ranks_.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    m.add_merge(std::get<std::string>(items[i].v), static_cast<int32_t>(std::min<size_t>(i, INT32_MAX)));
  }
  return m;
}

BpeModel BpeModel::from_merges(const std::vector<std::string>& merges) {
  BpeModel m;
  for (size_t i = 0; i < merges.size(); ++i) m.add_merge(merges[i], static_cast<int32_t>(i));
  return m;
}

void BpeModel::add_merge(std::string_view merge, int32_t rank) {
  // The separator is the first space after the first byte, so that a merge
  // whose left side is itself a space still parses.
  const size_t sp = merge.find(' ', 1);
  if (sp == std::string_view::npos) return;  // malformed: can never apply
  std::string key;
  key.reserve(merge.size());
  key.append(merge.substr(0, sp));
  key += kSep;
  key.append(merge.substr(sp + 1));
  ranks_.emplace(std::move(key), rank);  // a repeated merge keeps its first (lowest) rank
}

int32_t BpeModel::rank(std::string_view left, std::string_view right, std::string& scratch) const {
  scratch.assign(left);
  scratch += kSep;
  scratch.append(right);
  auto it = ranks_.find(std::string_view(scratch));
  return it == ranks_.end() ? -1 : it->second;
}

void BpeModel::encode_word(const Vocab& vocab, std::string_view word, std::vector<TokenId>& out) const {
  std::string text;
  text.reserve(word.size() * 2);
  for (const char ch : word) text += unicode::byte_to_bpe_char(static_cast<uint8_t>(ch));
  if (text.empty()) return;

  if (vocab.ignore_merges) {
    const TokenId id = vocab.find(text);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
  }

  std::vector<Symbol> symbols = tokenizer_detail::utf8_symbols(text);

  std::string scratch;
  const std::string_view t = text;
  tokenizer_detail::merge_symbols<int32_t>(
      symbols,
      [&](int32_t left, int32_t right, int32_t* rk) {
        const Symbol& l = symbols[(size_t)left];
        const Symbol& r = symbols[(size_t)right];
        *rk = rank(t.substr(l.start, l.len), t.substr(r.start, r.len), scratch);
        return *rk >= 0;
      },
      WorseCandidate{});

  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = t.substr(symbols[i].start, symbols[i].len);
    const TokenId id = vocab.find(piece);
    if (id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (const char ch : piece) {
      const TokenId b = vocab.find(std::string_view(&ch, 1));
      if (b != kNoToken) out.push_back(b);
    }
  }
}

void BpeModel::encode(const Vocab& vocab, const PreTokenizer& pre, std::string_view text,
                      std::vector<TokenId>& out) const {
  for (const std::string& word : pre.split(text)) encode_word(vocab, word, out);
}

}  // namespace serval
