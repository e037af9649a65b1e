// UTF-8 handling and the generated Unicode tables, checked against facts of
// the Unicode standard (not against our own tables).
#include <gtest/gtest.h>

#include "tokenizer/unicode.h"

namespace serval::unicode {
namespace {

TEST(Unicode, DecodeValidSequences) {
  const std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";  // a é 中 😀
  EXPECT_EQ(utf8_to_codepoints(s), (std::vector<uint32_t>{'a', 0xE9, 0x4E2D, 0x1F600}));
}

TEST(Unicode, DecodeMalformedGivesOneReplacementPerByte) {
  // stray continuation, truncated 3-byte sequence, 0xFF
  EXPECT_EQ(utf8_to_codepoints("\x80"), (std::vector<uint32_t>{kReplacementChar}));
  EXPECT_EQ(utf8_to_codepoints("\xE4\xB8"), (std::vector<uint32_t>{kReplacementChar, kReplacementChar}));
  EXPECT_EQ(utf8_to_codepoints("\xFFz"), (std::vector<uint32_t>{kReplacementChar, 'z'}));
  EXPECT_EQ(utf8_to_codepoints("\xC3("), (std::vector<uint32_t>{kReplacementChar, '('}));
}

TEST(Unicode, EncodeRoundTrip) {
  for (uint32_t cp : {0x24u, 0xA2u, 0x20ACu, 0x10348u, 0x10FFFFu}) {
    const std::string s = codepoint_to_utf8(cp);
    EXPECT_EQ(utf8_to_codepoints(s), std::vector<uint32_t>{cp});
  }
  EXPECT_EQ(codepoint_to_utf8(0x110000), "\xEF\xBF\xBD");
  EXPECT_EQ(codepoint_to_utf8(0x20AC), "\xE2\x82\xAC");
}

TEST(Unicode, LeadLength) {
  EXPECT_EQ(utf8_len_from_lead('a'), 1u);
  EXPECT_EQ(utf8_len_from_lead(0x80), 1u);
  EXPECT_EQ(utf8_len_from_lead(0xC3), 2u);
  EXPECT_EQ(utf8_len_from_lead(0xE4), 3u);
  EXPECT_EQ(utf8_len_from_lead(0xF0), 4u);
}

TEST(Unicode, CompletePrefixHoldsBackOnlyUnfinishedSequences) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8\xAD"), 5u);
  EXPECT_EQ(utf8_complete_prefix("\xF0\x9F\x98"), 0u);
  EXPECT_EQ(utf8_complete_prefix("a\x80"), 2u);      // stray continuation: never completes
  EXPECT_EQ(utf8_complete_prefix("a\xE4("), 3u);     // broken already
  EXPECT_EQ(utf8_complete_prefix("a\xE0\x80"), 3u);  // overlong: can never be valid
  EXPECT_EQ(utf8_complete_prefix("a\xFF"), 2u);
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
}

TEST(Unicode, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(sanitize_utf8("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
  EXPECT_EQ(sanitize_utf8("a\xE4\xB8z"), "a\xEF\xBF\xBDz");            // one U+FFFD for the 2-byte stub
  EXPECT_EQ(sanitize_utf8("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");    // each stray byte
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");    // overlong '/'
}

TEST(Unicode, Categories) {
  EXPECT_EQ(category('A'), Category::L);
  EXPECT_EQ(category('7'), Category::N);
  EXPECT_EQ(category('!'), Category::P);
  EXPECT_EQ(category('$'), Category::S);
  EXPECT_EQ(category('~'), Category::S);
  EXPECT_EQ(category(' '), Category::Z);
  EXPECT_EQ(category('\n'), Category::C);
  EXPECT_EQ(category(0x0301), Category::M);   // combining acute accent
  EXPECT_EQ(category(0x4E2D), Category::L);   // 中
  EXPECT_EQ(category(0x0661), Category::N);   // Arabic-Indic digit one
  EXPECT_EQ(category(0x00BD), Category::N);   // ½
  EXPECT_EQ(category(0x3002), Category::P);   // ideographic full stop
  EXPECT_EQ(category(0x1F600), Category::S);  // 😀
  EXPECT_EQ(category(0x200D), Category::C);   // zero width joiner (Cf)
  EXPECT_EQ(category(0xE000), Category::C);   // private use
  EXPECT_EQ(category(0x0378), Category::C);   // unassigned
  EXPECT_EQ(category(0x110000), Category::C);
}

TEST(Unicode, Whitespace) {
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u,
                      0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_TRUE(is_whitespace(cp)) << std::hex << cp;
  }
  for (uint32_t cp : {0x1Cu, 0x1Fu, 0x61u, 0x200Bu, 0x180Eu, 0xFEFFu}) EXPECT_FALSE(is_whitespace(cp)) << std::hex << cp;
}

TEST(Unicode, LowercaseAndNfd) {
  EXPECT_EQ(to_lower('Q'), uint32_t{'q'});
  EXPECT_EQ(to_lower('q'), uint32_t{'q'});
  EXPECT_EQ(to_lower(0x00C9), 0x00E9u);  // É -> é
  EXPECT_EQ(to_lower(0x03A3), 0x03C3u);  // Σ -> σ
  EXPECT_EQ(to_lower(0x0130), 0x0069u);  // İ -> i (first code point of "i̇")
  EXPECT_EQ(to_lower(0x4E2D), 0x4E2Du);
  EXPECT_EQ(nfd_base(0x00E9), uint32_t{'e'});   // é
  EXPECT_EQ(nfd_base(0x1EC7), uint32_t{'e'});   // ệ (two marks)
  EXPECT_EQ(nfd_base(0x00C5), uint32_t{'A'});   // Å
  EXPECT_EQ(nfd_base(0x212B), uint32_t{'A'});   // Ångström sign
  EXPECT_EQ(nfd_base(0xAC00), 0x1100u);          // 가 -> ᄀ
  EXPECT_EQ(nfd_base('e'), uint32_t{'e'});
  EXPECT_EQ(nfd_base(0x00DF), 0x00DFu);          // ß has no decomposition
}

TEST(Unicode, GptByteMapping) {
  // Printable bytes map to themselves, the rest to U+0100.. in byte order.
  EXPECT_EQ(byte_to_bpe_char('A'), "A");
  EXPECT_EQ(byte_to_bpe_char(' '), "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(byte_to_bpe_char('\n'), "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(byte_to_bpe_char(0x00), "\xC4\x80");  // Ā U+0100
  EXPECT_EQ(byte_to_bpe_char(0xAD), "\xC5\x83");  // soft hyphen -> U+0143
  EXPECT_EQ(byte_to_bpe_char(0xE9), "\xC3\xA9");
  for (int b = 0; b < 256; ++b) {
    const auto cps = utf8_to_codepoints(byte_to_bpe_char(static_cast<uint8_t>(b)));
    ASSERT_EQ(cps.size(), 1u);
    EXPECT_EQ(bpe_char_to_byte(cps[0]), b);
  }
  EXPECT_EQ(bpe_char_to_byte(' '), -1);
  EXPECT_EQ(bpe_char_to_byte(0x4E2D), -1);
}

}  // namespace
}  // namespace serval::unicode
