// Runtime of constrained decoding: which tokens keep the output inside a
// grammar's language.
//
// TokenTrie: the vocabulary's token byte strings in one prefix tree, laid out
// in preorder (node, its subtree, then its next sibling), built once per
// tokenizer and shared by every sequence. Tokens with an empty piece
// (control tokens) are not in it: only end-of-generation tokens are ever
// allowed besides text, and only where the grammar may end.
//
// GrammarMatcher: one sequence's position in the grammar, as a set of
// pushdown stacks (llama.cpp's approach). A stack is interned: a node
// (element position, parent node), so stacks share their tails, a stack is
// one integer and a set of stacks a sorted vector of integers. Each stack's
// top is a terminal (a character class); consuming a character it accepts
// yields a successor set that does not depend on which character it was,
// so it is computed once per stack and memoized. Output is matched byte by
// byte: a partial UTF-8 sequence is kept in the state, and its bytes are
// accepted only while some stack's class intersects the code points it can
// still become.
//
// fill_mask() walks the trie once: each trie node's state is its parent's
// advanced by one byte, and a subtree whose state is empty is skipped. The
// resulting bitset is cached per state (stack set + partial UTF-8), so a
// state met again (inside a JSON string, between list items ...) costs one
// hash lookup. The cache is bounded (kMaskCacheBytes per matcher).
//
// Bounds: the interned stacks of one matcher are capped (kMaxNodes) and a
// stack set at kMaxStacks; exceeding either puts the matcher in the `dead`
// state, where only end-of-generation is allowed. Not thread-safe: one
// matcher per sequence, used by the engine loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sampler/grammar/grammar.h"
#include "serval/sampling_params.h"

namespace serval {

class TokenTrie {
 public:
  // pieces[t]: the bytes token t adds to the output ("" for control tokens).
  // eog: the end-of-generation tokens.
  TokenTrie(std::vector<std::string> pieces, std::vector<TokenId> eog);

  struct Node {
    uint32_t end = 0;        // one past the last node of this subtree
    uint32_t tok_begin = 0;  // tokens whose piece ends here: toks[tok_begin, tok_end)
    uint32_t tok_end = 0;
    uint32_t depth = 0;      // bytes from the root
    uint8_t byte = 0;
  };

  int32_t n_vocab() const { return (int32_t)pieces_.size(); }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<TokenId>& tokens() const { return toks_; }
  const std::string& piece(TokenId t) const { return pieces_[(size_t)t]; }
  const std::vector<TokenId>& eog() const { return eog_; }
  bool is_eog(TokenId t) const;

 private:
  std::vector<std::string> pieces_;
  std::vector<TokenId> eog_;
  std::vector<Node> nodes_;
  std::vector<TokenId> toks_;
};

class GrammarMatcher {
 public:
  GrammarMatcher(GrammarPtr grammar, std::shared_ptr<const TokenTrie> trie);

  // bits[t / 64] bit (t % 64) set iff token t is allowed next. Resized to
  // the vocabulary. End-of-generation tokens are allowed iff can_end() (or
  // when nothing else is: the matcher is dead).
  void fill_mask(std::vector<uint64_t>& bits);
  // The same, with `budget` tokens left (this one included): when the
  // budget is tight, only tokens after which the grammar can still be
  // completed, and end-of-generation emitted, within the remaining
  // budget - 1 tokens (counting one token per character) are allowed, so a
  // constrained output ends complete rather than cut off by max_tokens (as
  // long as the vocabulary has the single characters of the shortest
  // completion; if no token qualifies the plain mask is used).
  void fill_mask(std::vector<uint64_t>& bits, int64_t budget);
  // Shortest completion of the current state, in code points (0: can end).
  uint32_t min_remaining();

  // Advances over token t. False (state unchanged) if t is not allowed.
  // An end-of-generation token is accepted iff can_end().
  bool accept_token(TokenId t);
  // Advances over raw bytes; false (state unchanged) if they leave the language.
  bool accept_bytes(std::string_view bytes);

  bool can_end() const;      // the grammar may end here
  // Benchmarks: turn the per-state mask cache off (every fill_mask walks the trie).
  void set_mask_cache(bool on) { mask_cache_on_ = on; }
  bool dead() const { return dead_; }
  size_t n_stacks() const { return state_.stacks.size(); }

 private:
  static constexpr uint32_t kNil = 0xFFFFFFFFu;     // no parent
  static constexpr uint32_t kAccept = 0xFFFFFFFEu;  // the empty stack: the grammar is complete
  static constexpr size_t kMaxNodes = 1u << 22;
  static constexpr size_t kMaxStacks = 1024;
  static constexpr size_t kMaskCacheBytes = 1u << 20;

  struct StackNode {
    uint32_t pos;     // position in grammar elems (a term for set members)
    uint32_t parent;  // continuation, or kNil
  };
  struct State {
    std::vector<uint32_t> stacks;  // sorted stack ids (kAccept last)
    uint32_t acc = 0;              // partial UTF-8: code point bits so far
    uint8_t need = 0;              // continuation bytes still expected
    uint8_t len = 0;               // length of the sequence in progress
  };

  uint32_t intern(uint32_t pos, uint32_t parent);
  void expand(uint32_t pos, uint32_t parent, std::vector<uint32_t>& out);
  void successors(uint32_t stack, uint32_t& off, uint32_t& len);
  bool step(const State& in, uint8_t byte, State& out);
  const CharClass& top_class(uint32_t stack) const;
  uint32_t rest(uint32_t stack);            // shortest completion of one stack
  uint32_t rest(const State& st);           // of a state (min over its stacks)
  void walk(std::vector<uint64_t>& bits, std::vector<uint64_t>* tight, int64_t budget, uint32_t& max_rest);
  void use_tight(std::vector<uint64_t>& bits, std::vector<uint64_t>& tight);

  GrammarPtr g_;
  std::shared_ptr<const TokenTrie> trie_;
  State state_;
  bool dead_ = false;
  bool finished_ = false;
  bool mask_cache_on_ = true;

  std::vector<StackNode> nodes_;
  std::unordered_map<uint64_t, uint32_t> intern_;
  std::vector<uint32_t> succ_off_, succ_len_;  // per stack node; off == kNil: not computed
  std::vector<uint32_t> rest_;                 // per stack node: rest(); kNil: not computed
  std::vector<uint32_t> rest_path_;            // rest() scratch
  std::vector<uint32_t> succ_pool_;
  std::vector<std::pair<uint32_t, uint32_t>> work_;  // expand() scratch
  std::unordered_map<uint64_t, char> seen_;          // expand() scratch

  std::vector<State> levels_;  // fill_mask scratch, one per trie depth
  struct VecHash {
    size_t operator()(const std::vector<uint32_t>& v) const;
  };
  // Per state: the plain mask and the largest rest() after any allowed
  // token (a budget at least one above it leaves the mask unchanged).
  struct CachedMask {
    std::vector<uint64_t> bits;
    uint32_t max_rest = 0;
  };
  std::unordered_map<std::vector<uint32_t>, CachedMask, VecHash> mask_cache_;
};

}  // namespace serval
