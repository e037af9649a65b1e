// StopMatcher: finds the request's stop strings in the streamed text.
//
// Fed the detokenized text piece by piece, it hands back the text that is
// safe to stream now and holds back any tail that could still grow into a
// stop string. When a stop string completes, the output ends just before it
// (the stop string itself is not returned, as OpenAI does) and the match is
// reported.
//
// The result does not depend on how the text is split into pieces: it is
// what a byte-by-byte scan gives that stops at the first byte where any stop
// string ends, cutting before the longest stop string ending there. So with
// stops {"ab", "abc"}, "ab" wins (it ends first); with {"bc", "abcd"} and
// text "abce", "bc" wins and the output is "a".
//
// Works on bytes. If the pieces are whole UTF-8 characters and the stop
// strings are valid UTF-8, every emitted chunk ends on a character boundary
// (a match can only start at a lead byte).
//
// Value type owned by the sequence's output stream; not thread-safe. Cost
// per feed: O(held + piece) per stop string; the held-back tail is shorter
// than the longest stop string.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace serval {

class StopMatcher {
 public:
  // Empty strings in `stops` are ignored (validate() rejects them upstream).
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends to `out` the text that can be streamed now. Returns true when a
  // stop string completed: `out` then got everything before the match, the
  // rest of the piece is discarded, and stopped() is true. Feeding after a
  // stop is a programmer error (asserted).
  bool feed(std::string_view piece, std::string& out);

  // Generation ended for another reason (EOS, max_tokens): appends the
  // held-back text to `out`. No-op after a stop.
  void finish(std::string& out);

  bool stopped() const { return matched_ >= 0; }
  // Index into the constructor's `stops` of the string that matched; -1 if none.
  int matched_index() const { return matched_; }
  // Bytes currently held back.
  size_t held_bytes() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;  // as given (empty ones kept so indices match, never searched)
  std::string pending_;             // text received but not yet emitted
  int matched_ = -1;
};

}  // namespace serval
