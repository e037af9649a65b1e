#include "engine/token_trie_for.h"

namespace serval {

std::shared_ptr<const TokenTrie> token_trie_for(const Tokenizer& tok) {
  std::vector<std::string> pieces((size_t)tok.n_vocab());
  std::vector<TokenId> eog;
  for (TokenId t = 0; t < tok.n_vocab(); ++t) {
    if (!tok.is_control(t)) pieces[(size_t)t] = tok.token_to_piece(t);
    if (tok.is_eog(t)) eog.push_back(t);
  }
  return std::make_shared<TokenTrie>(std::move(pieces), std::move(eog));
}

}  // namespace serval
