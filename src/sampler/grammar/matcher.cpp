#include "sampler/grammar/matcher.h"

#include <algorithm>
#include <numeric>

namespace serval {

// ---------------------------------------------------------------------------
// TokenTrie

TokenTrie::TokenTrie(std::vector<std::string> pieces, std::vector<TokenId> eog)
    : pieces_(std::move(pieces)), eog_(std::move(eog)) {
  std::sort(eog_.begin(), eog_.end());
  std::vector<TokenId> order;
  for (size_t t = 0; t < pieces_.size(); ++t)
    if (!pieces_[t].empty() && !is_eog((TokenId)t)) order.push_back((TokenId)t);
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return pieces_[(size_t)a] < pieces_[(size_t)b] || (pieces_[(size_t)a] == pieces_[(size_t)b] && a < b);
  });
  nodes_.push_back(Node{});  // root
  std::vector<uint32_t> path{0};  // node index per depth
  std::string_view prev;
  for (TokenId t : order) {
    const std::string& p = pieces_[(size_t)t];
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < p.size() && prev[lcp] == p[lcp]) ++lcp;
    while (path.size() > lcp + 1) {
      nodes_[path.back()].end = (uint32_t)nodes_.size();
      path.pop_back();
    }
    for (size_t d = lcp; d < p.size(); ++d) {
      Node n;
      n.byte = (uint8_t)p[d];
      n.depth = (uint32_t)(d + 1);
      n.tok_begin = n.tok_end = (uint32_t)toks_.size();
      path.push_back((uint32_t)nodes_.size());
      nodes_.push_back(n);
    }
    toks_.push_back(t);
    nodes_[path.back()].tok_end = (uint32_t)toks_.size();
    prev = p;
  }
  while (!path.empty()) {
    nodes_[path.back()].end = (uint32_t)nodes_.size();
    path.pop_back();
  }
}

bool TokenTrie::is_eog(TokenId t) const { return std::binary_search(eog_.begin(), eog_.end(), t); }

// ---------------------------------------------------------------------------
// GrammarMatcher

size_t GrammarMatcher::VecHash::operator()(const std::vector<uint32_t>& v) const {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
  return (size_t)h;
}

GrammarMatcher::GrammarMatcher(GrammarPtr grammar, std::shared_ptr<const TokenTrie> trie)
    : g_(std::move(grammar)), trie_(std::move(trie)) {
  for (uint32_t a : g_->rule_alts[g_->root]) expand(a, kNil, state_.stacks);
  std::sort(state_.stacks.begin(), state_.stacks.end());
  state_.stacks.erase(std::unique(state_.stacks.begin(), state_.stacks.end()), state_.stacks.end());
}

uint32_t GrammarMatcher::intern(uint32_t pos, uint32_t parent) {
  const uint64_t key = ((uint64_t)pos << 32) | parent;
  auto [it, inserted] = intern_.try_emplace(key, (uint32_t)nodes_.size());
  if (inserted) {
    if (nodes_.size() >= kMaxNodes) {
      dead_ = true;
      intern_.erase(it);
      return 0;
    }
    nodes_.push_back({pos, parent});
    rest_.push_back(kNil);
    succ_off_.push_back(kNil);
    succ_len_.push_back(0);
  }
  return it->second;
}

// Every stack reachable from "at pos, then continue with parent" without
// consuming a character: stacks whose top is a term, and kAccept when the
// whole grammar can be complete. Iterative; `seen_` removes repeats.
void GrammarMatcher::expand(uint32_t pos, uint32_t parent, std::vector<uint32_t>& out) {
  const auto& elems = g_->elems;
  seen_.clear();
  work_.clear();
  work_.push_back({pos, parent});
  while (!work_.empty() && !dead_) {
    auto [p, par] = work_.back();
    work_.pop_back();
    if (!seen_.try_emplace(((uint64_t)p << 32) | par, 0).second) continue;
    const GrammarElem& e = elems[p];
    if (e.kind == GrammarElem::end) {
      if (par == kNil) out.push_back(kAccept);
      else work_.push_back({nodes_[par].pos, nodes_[par].parent});
    } else if (e.kind == GrammarElem::term) {
      out.push_back(intern(p, par));
    } else {
      // A reference that ends its alternative continues straight with the
      // parent (a tail call), so repetition loops keep the stack flat.
      const uint32_t cont = elems[p + 1].kind == GrammarElem::end ? par : intern(p + 1, par);
      for (uint32_t a : g_->rule_alts[e.value]) work_.push_back({a, cont});
    }
    if (out.size() > kMaxStacks) dead_ = true;
  }
}

void GrammarMatcher::successors(uint32_t stack, uint32_t& off, uint32_t& len) {
  if (succ_off_[stack] == kNil) {
    std::vector<uint32_t> tmp;
    const StackNode n = nodes_[stack];
    expand(n.pos + 1, n.parent, tmp);
    std::sort(tmp.begin(), tmp.end());
    tmp.erase(std::unique(tmp.begin(), tmp.end()), tmp.end());
    succ_off_[stack] = (uint32_t)succ_pool_.size();
    succ_len_[stack] = (uint32_t)tmp.size();
    succ_pool_.insert(succ_pool_.end(), tmp.begin(), tmp.end());
  }
  off = succ_off_[stack];
  len = succ_len_[stack];
}

const CharClass& GrammarMatcher::top_class(uint32_t stack) const {
  return g_->classes[g_->elems[nodes_[stack].pos].value];
}

bool GrammarMatcher::step(const State& in, uint8_t b, State& out) {
  uint32_t cp;
  uint8_t need, len;
  if (in.need == 0) {
    if (b < 0x80) cp = b, need = 0, len = 1;
    else if (b >= 0xC2 && b <= 0xDF) cp = b & 0x1Fu, need = 1, len = 2;
    else if ((b >> 4) == 0xE) cp = b & 0x0Fu, need = 2, len = 3;
    else if (b >= 0xF0 && b <= 0xF4) cp = b & 0x07u, need = 3, len = 4;
    else return false;
  } else {
    if ((b & 0xC0) != 0x80) return false;
    cp = (in.acc << 6) | (b & 0x3Fu);
    need = (uint8_t)(in.need - 1);
    len = in.len;
  }
  // The smallest code point of a sequence of this length (no overlong forms).
  static constexpr uint32_t kMinOfLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  out.acc = cp;
  out.need = need;
  out.len = len;
  out.stacks.clear();
  if (need == 0 && (cp < kMinOfLen[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) return false;
  if (need > 0) {
    // Keep the stacks; require that one of them can take a code point with this prefix.
    const uint32_t hi = std::min<uint32_t>(((cp + 1) << (6 * need)) - 1, 0x10FFFF);
    const uint32_t lo = std::max(cp << (6 * need), kMinOfLen[len]);
    if (lo > hi) return false;
    // Every completion of this prefix a surrogate (ED A0..BF): invalid
    // UTF-8, however it continues.
    if (lo >= 0xD800 && hi <= 0xDFFF) return false;
    bool any = false;
    for (uint32_t s : in.stacks)
      if (s != kAccept && top_class(s).intersects(lo, hi)) { any = true; break; }
    if (!any) return false;
    out.stacks = in.stacks;
    return true;
  }
  size_t sources = 0;
  for (uint32_t s : in.stacks) {
    if (s == kAccept || !top_class(s).contains(cp)) continue;
    uint32_t off, len;
    successors(s, off, len);
    out.stacks.insert(out.stacks.end(), succ_pool_.begin() + off, succ_pool_.begin() + off + len);
    ++sources;
  }
  if (sources > 1) {
    std::sort(out.stacks.begin(), out.stacks.end());
    out.stacks.erase(std::unique(out.stacks.begin(), out.stacks.end()), out.stacks.end());
    if (out.stacks.size() > kMaxStacks) dead_ = true;
  }
  return !out.stacks.empty();
}

bool GrammarMatcher::can_end() const {
  return !finished_ && state_.need == 0 && !state_.stacks.empty() && state_.stacks.back() == kAccept;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (dead_ || finished_) return false;
  State cur = state_, next;
  for (char c : bytes) {
    if (!step(cur, (uint8_t)c, next)) return false;
    std::swap(cur, next);
  }
  if (dead_) return false;
  state_ = std::move(cur);
  return true;
}

bool GrammarMatcher::accept_token(TokenId t) {
  if (t < 0 || t >= trie_->n_vocab()) return false;
  if (trie_->is_eog(t)) {
    if (!can_end() && !dead_) return false;
    finished_ = true;
    return true;
  }
  const std::string& p = trie_->piece(t);
  if (p.empty()) return false;
  return accept_bytes(p);
}

uint32_t GrammarMatcher::rest(uint32_t stack) {
  if (stack == kAccept) return 0;
  // Iterative over the parent chain (stacks can be deep): find the first
  // node with a known value, then fill in the path back down.
  rest_path_.clear();
  uint32_t s = stack;
  while (s != kNil && rest_[s] == kNil) {
    rest_path_.push_back(s);
    s = nodes_[s].parent;
  }
  uint64_t acc = s == kNil ? 0 : rest_[s];
  for (size_t i = rest_path_.size(); i-- > 0;) {
    const uint32_t n = rest_path_[i];
    acc = std::min<uint64_t>(acc + g_->min_rest[nodes_[n].pos], CompiledGrammar::kNoEnd - 1);
    rest_[n] = (uint32_t)acc;
  }
  return rest_[stack];
}

uint32_t GrammarMatcher::rest(const State& st) {
  uint32_t best = CompiledGrammar::kNoEnd;
  if (st.need == 0) {
    for (uint32_t s : st.stacks) best = std::min(best, rest(s));
    return best;
  }
  // Only the stacks that can take the character in progress count.
  static constexpr uint32_t kMinOfLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  const uint32_t hi = std::min<uint32_t>(((st.acc + 1) << (6 * st.need)) - 1, 0x10FFFF);
  const uint32_t lo = std::max(st.acc << (6 * st.need), kMinOfLen[st.len]);
  for (uint32_t s : st.stacks)
    if (s != kAccept && top_class(s).intersects(lo, hi)) best = std::min(best, rest(s));
  // Inside a UTF-8 sequence the character in progress (counted once in the
  // stacks) still needs `need` bytes, each possibly a token of its own.
  if (st.need > 0 && best != CompiledGrammar::kNoEnd) best += st.need - 1u;
  return best;
}

uint32_t GrammarMatcher::min_remaining() {
  if (dead_ || finished_) return 0;
  return rest(state_);
}

// One walk of the trie from the current state: `bits` gets every token the
// grammar allows; `tight` (when given) those after which the shortest
// completion plus the end-of-generation token fits in budget - 1 tokens.
// max_rest: the largest shortest completion after any allowed token.
void GrammarMatcher::walk(std::vector<uint64_t>& bits, std::vector<uint64_t>* tight, int64_t budget, uint32_t& max_rest) {
  const auto& nodes = trie_->nodes();
  const auto& toks = trie_->tokens();
  if (levels_.empty()) {
    size_t max_depth = 0;
    for (const auto& n : nodes) max_depth = std::max<size_t>(max_depth, n.depth);
    levels_.resize(max_depth + 1);
  }
  max_rest = 0;
  levels_[0] = state_;
  for (size_t i = 1; i < nodes.size();) {
    const TokenTrie::Node& n = nodes[i];
    if (!step(levels_[n.depth - 1], n.byte, levels_[n.depth])) {
      i = n.end;
      continue;
    }
    if (n.tok_begin < n.tok_end) {
      const uint32_t r = rest(levels_[n.depth]);
      max_rest = std::max(max_rest, r);
      const bool fits = tight && (int64_t)r + 1 <= budget - 1;
      for (uint32_t k = n.tok_begin; k < n.tok_end; ++k) {
        const uint64_t b = 1ull << (toks[k] & 63);
        bits[(size_t)toks[k] >> 6] |= b;
        if (fits) (*tight)[(size_t)toks[k] >> 6] |= b;
      }
    }
    ++i;
  }
}

void GrammarMatcher::fill_mask(std::vector<uint64_t>& bits) { fill_mask(bits, -1); }

void GrammarMatcher::fill_mask(std::vector<uint64_t>& bits, int64_t budget) {
  const size_t words = ((size_t)trie_->n_vocab() + 63) / 64;
  auto allow_eog = [&](std::vector<uint64_t>& b) {
    for (TokenId t : trie_->eog()) b[(size_t)t >> 6] |= 1ull << (t & 63);
  };
  if (dead_ || finished_) {
    bits.assign(words, 0);
    allow_eog(bits);
    return;
  }
  std::vector<uint32_t> key = state_.stacks;
  key.push_back(state_.acc);
  key.push_back(state_.need | (uint32_t)state_.len << 8);
  auto fits = [&](uint32_t max_rest) { return budget < 0 || (int64_t)max_rest + 1 <= budget - 1; };
  if (auto it = mask_cache_.find(key); mask_cache_on_ && it != mask_cache_.end()) {
    bits = it->second.bits;
    if (fits(it->second.max_rest)) return;
    std::vector<uint64_t> plain(words, 0), tight(words, 0);
    uint32_t max_rest = 0;
    walk(plain, &tight, budget, max_rest);
    use_tight(bits, tight);
    return;
  }
  bits.assign(words, 0);
  std::vector<uint64_t> tight(budget >= 0 ? words : 0, 0);
  uint32_t max_rest = 0;
  walk(bits, budget >= 0 ? &tight : nullptr, budget, max_rest);
  if (can_end()) allow_eog(bits);
  if (dead_) {  // a bound was hit during the walk: only end-of-generation from now on
    bits.assign(words, 0);
    allow_eog(bits);
    return;
  }
  bool any = false;
  for (uint64_t w : bits) any |= w != 0;
  if (!any) allow_eog(bits);  // a dead end (should not happen): let the sequence stop
  if (mask_cache_on_) {
    if ((mask_cache_.size() + 1) * words * 8 > kMaskCacheBytes) mask_cache_.clear();
    mask_cache_[key] = CachedMask{bits, max_rest};
  }
  if (fits(max_rest)) return;
  use_tight(bits, tight);
}

// Tight budget: keep only the tokens that leave a short enough completion
// (unless none does: then the plain mask, best effort).
void GrammarMatcher::use_tight(std::vector<uint64_t>& bits, std::vector<uint64_t>& tight) {
  bool any_text = false;
  for (uint64_t w : tight) any_text |= w != 0;
  if (can_end()) {
    for (TokenId t : trie_->eog()) tight[(size_t)t >> 6] |= 1ull << (t & 63);
  }
  if ((any_text || can_end()) && !dead_) bits.swap(tight);
}

}  // namespace serval
