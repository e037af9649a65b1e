// StopMatcher: stop strings across piece boundaries, hold-back of possible
// prefixes, several stops, and piece-independence against a byte-by-byte
// reference.
#include "sampler/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sampler/rng.h"

namespace serval {
namespace {

struct StopRun {
  std::vector<std::string> emitted;  // what each feed() (and then finish()) appended
  std::string text;                  // all of it
  bool stopped = false;
  int matched = -1;
};

StopRun run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  StopRun r;
  for (const std::string& p : pieces) {
    std::string out;
    const bool stop = m.feed(p, out);
    r.emitted.push_back(out);
    r.text += out;
    if (stop) break;
  }
  if (!m.stopped()) {
    std::string out;
    m.finish(out);
    r.emitted.push_back(out);
    r.text += out;
  }
  r.stopped = m.stopped();
  r.matched = m.matched_index();
  return r;
}

struct Case {
  const char* name;
  std::vector<std::string> stops;
  std::vector<std::string> pieces;
  std::vector<std::string> emitted;  // per feed, then finish() if not stopped
  bool stopped;
  int matched;
};

class StopMatcherTable : public ::testing::TestWithParam<Case> {};

TEST_P(StopMatcherTable, EmitsHoldsAndStops) {
  const Case& c = GetParam();
  const StopRun r = run(c.stops, c.pieces);
  EXPECT_EQ(r.emitted, c.emitted);
  EXPECT_EQ(r.stopped, c.stopped);
  EXPECT_EQ(r.matched, c.matched);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, StopMatcherTable,
    ::testing::Values(
        // No stop strings at all: everything streams immediately.
        Case{"no_stops", {}, {"Hello", ", ", "world"}, {"Hello", ", ", "world", ""}, false, -1},
        // No stop occurs; nothing is a prefix, so nothing is held.
        Case{"no_match", {"###"}, {"Hello", " world"}, {"Hello", " world", ""}, false, -1},
        // "###" split over three pieces: "a#" holds "#", "#" holds "##", "#b" completes.
        Case{"split_across_three_pieces", {"###"}, {"a#", "#", "#b"}, {"a", "", ""}, true, 0},
        // False start "ab" + "x", then the real "abc".
        Case{"false_start_then_match", {"abc"}, {"xab", "xab", "c", "tail"}, {"x", "abx", ""}, true, 0},
        // A held prefix that never completes is released by finish().
        Case{"held_prefix_released_at_finish", {"abc"}, {"12ab"}, {"12", "ab"}, false, -1},
        // Stop at the very start of the output.
        Case{"stop_at_start", {"STOP"}, {"STOP and more"}, {""}, true, 0},
        // The stop string is a whole piece.
        Case{"whole_piece", {"\n\n"}, {"Line", "\n\n", "next"}, {"Line", ""}, true, 0},
        // One stop is a prefix of another: the shorter completes first.
        Case{"prefix_stop_wins", {"abc", "ab"}, {"xa", "bc"}, {"x", ""}, true, 1},
        // Overlapping candidates: "bc" ends before "abcd" could.
        Case{"earliest_end_wins", {"abcd", "bc"}, {"a", "b", "ce"}, {"", "", "a"}, true, 1},
        // Two stops end at the same byte: cut before the longer one.
        Case{"same_end_longest_cut", {"b", "ab"}, {"xab"}, {"x"}, true, 1},
        // Self-overlapping stop: "aab" inside "aaab".
        Case{"self_overlap", {"aab"}, {"a", "a", "a", "b"}, {"", "", "a", ""}, true, 0},
        // Held tail covers the longest possible prefix among several stops.
        Case{"hold_longest_prefix", {"xyz", "yq"}, {"axy", "q"}, {"a", "x"}, true, 1},
        // Match inside a single long piece, text after it is dropped.
        Case{"mid_piece", {"END"}, {"one two END three"}, {"one two "}, true, 0},
        // Multi-byte UTF-8: the stop "。" (3 bytes) is held whole, never split.
        Case{"utf8", {"\xE3\x80\x82"}, {"hi\xE3\x80", "\x82 more"}, {"hi", ""}, true, 0}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(StopMatcher, HeldBytesNeverReachTheLongestStop) {
  StopMatcher m({"abcdef"});
  std::string out;
  EXPECT_FALSE(m.feed("zzabcde", out));
  EXPECT_EQ(out, "zz");
  EXPECT_EQ(m.held_bytes(), 5u);
  EXPECT_FALSE(m.feed("X", out));
  EXPECT_EQ(out, "zzabcdeX");
  EXPECT_EQ(m.held_bytes(), 0u);
}

// Byte-by-byte reference: the first byte position where any stop string
// ends; output is cut before the longest stop ending there.
std::string reference(const std::string& text, const std::vector<std::string>& stops, bool* stopped) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t cut_len = 0;
    for (const std::string& s : stops) {
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) cut_len = std::max(cut_len, s.size());
    }
    if (cut_len > 0) {
      *stopped = true;
      return text.substr(0, end - cut_len);
    }
  }
  *stopped = false;
  return text;
}

TEST(StopMatcher, OutputIndependentOfPieceBoundaries) {
  Rng rng(2024);
  auto below = [&](uint64_t n) { return static_cast<size_t>(rng.next_u64() % n); };
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::string> stops(1 + below(3));
    for (std::string& s : stops) {
      s.resize(1 + below(4));
      for (char& ch : s) ch = "ab"[below(2)];
    }
    std::string text(below(24), ' ');
    for (char& ch : text) ch = "abc"[below(3)];
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t len = std::min(text.size() - i, 1 + below(5));
      pieces.push_back(text.substr(i, len));
      i += len;
    }
    bool want_stop = false;
    const std::string want = reference(text, stops, &want_stop);
    const StopRun r = run(stops, pieces);
    ASSERT_EQ(r.text, want) << "iter " << iter << " text '" << text << "'";
    ASSERT_EQ(r.stopped, want_stop) << "iter " << iter;
  }
}

}  // namespace
}  // namespace serval
