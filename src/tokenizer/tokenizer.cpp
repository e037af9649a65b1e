#include "tokenizer/tokenizer.h"

#include <optional>

#include "tokenizer/bpe.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/special_split.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"
#include "tokenizer/wpm.h"

namespace serval {

struct Tokenizer::Impl {
  Vocab vocab;
  SpecialSplitter splitter;
  std::optional<BpeModel> bpe;         // BPE only
  std::optional<PreTokenizer> pre;     // BPE only
  std::vector<std::string> pieces;     // token_to_piece(id, render_special = true)
};

Expected<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& f) {
  auto impl = std::make_shared<Impl>();
  Expected<Vocab> vocab = load_vocab(f);
  if (!vocab.ok()) return vocab.status();
  impl->vocab = std::move(vocab.value());
  const Vocab& v = impl->vocab;

  if (v.type == VocabType::bpe) {
    Expected<BpeModel> bpe = BpeModel::load(f);
    if (!bpe.ok()) return bpe.status();
    impl->bpe = std::move(bpe.value());
    Expected<PreTokenizer> pre = PreTokenizer::create(v.pre_spec.regexes);
    if (!pre.ok()) return pre.status().with_context("pre-tokenizer '" + v.pre_spec.name + "'");
    impl->pre = std::move(pre.value());
  }
  impl->splitter = SpecialSplitter(v);
  impl->pieces.reserve(v.tokens.size());
  for (TokenId id = 0; id < v.n_tokens(); ++id) impl->pieces.push_back(render_piece(v, id));
  return Tokenizer(std::move(impl));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Vocab& v = impl_->vocab;
  std::vector<TokenId> out;
  if (add_special && v.add_bos) out.push_back(v.bos);

  const std::vector<Fragment> frags = impl_->splitter.split(v, text, parse_special);
  bool after_special = true;  // SPM: a text fragment at the start or after a special token gets the space prefix
  std::string buf;
  for (const Fragment& f : frags) {
    if (f.token != kNoToken) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string_view piece = text.substr(f.offset, f.length);
    switch (v.type) {
      case VocabType::spm:
        buf.clear();
        if (v.add_space_prefix && after_special) buf += ' ';
        buf.append(piece);
        spm_encode(v, spm_escape_spaces(buf), out);
        break;
      case VocabType::bpe:
        impl_->bpe->encode(v, *impl_->pre, piece, out);
        break;
      case VocabType::wpm:
        wpm_encode(v, piece, out);
        break;
    }
    after_special = false;
  }

  if (add_special && v.add_eos) out.push_back(v.eos);
  if (add_special && v.add_sep) out.push_back(v.sep);
  return out;
}

std::string Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  const Vocab& v = impl_->vocab;
  if (!v.valid(id)) return {};
  if (!render_special && (v.attr(id) & (token_attr::control | token_attr::unknown))) return {};
  return impl_->pieces[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special, bool whole_text) const {
  const Vocab& v = impl_->vocab;
  std::string out;
  const bool after_bos = !ids.empty() && v.bos != kNoToken && ids[0] == v.bos;
  bool strip_space = v.add_space_prefix && !render_special && (after_bos || whole_text);
  for (const TokenId id : ids) {
    std::string piece = token_to_piece(id, render_special);
    if (strip_space && !piece.empty()) {
      if (piece[0] == ' ') piece.erase(0, 1);
      strip_space = false;
    }
    out += piece;
  }
  if (v.clean_spaces) clean_up_spaces(out);
  return out;
}

int32_t Tokenizer::n_vocab() const { return impl_->vocab.n_tokens(); }
VocabType Tokenizer::type() const { return impl_->vocab.type; }
TokenId Tokenizer::bos() const { return impl_->vocab.bos; }
TokenId Tokenizer::eos() const { return impl_->vocab.eos; }
bool Tokenizer::add_bos() const { return impl_->vocab.add_bos; }
bool Tokenizer::add_eos() const { return impl_->vocab.add_eos; }

bool Tokenizer::is_eog(TokenId id) const {
  const auto& eog = impl_->vocab.eog;
  return id != kNoToken && std::binary_search(eog.begin(), eog.end(), id);
}

bool Tokenizer::is_control(TokenId id) const {
  return impl_->vocab.valid(id) && (impl_->vocab.attr(id) & token_attr::control);
}

const std::string& Tokenizer::token_text(TokenId id) const {
  static const std::string kEmpty;
  return impl_->vocab.valid(id) ? impl_->vocab.tokens[static_cast<size_t>(id)].text : kEmpty;
}

const Vocab& Tokenizer::vocab() const { return impl_->vocab; }

}  // namespace serval
