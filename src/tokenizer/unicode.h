// Unicode helpers for the tokenizers: UTF-8 decoding/encoding, general
// categories, White_Space, simple lowercase, the NFD base character and the
// GPT-2 byte <-> character mapping of byte-level BPE.
//
// Tables come from scripts/gen_unicode_tables.py (Python's unicodedata).
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace serval::unicode {

constexpr uint32_t kReplacementChar = 0xFFFD;
constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// General-category group (the first letter of the Unicode category).
// Unassigned code points and surrogates are C.
enum class Category : uint8_t { C, L, M, N, P, S, Z };

// Byte length of the UTF-8 sequence that starts with `lead`, judged only by
// its high nibble (1 for ASCII and for stray continuation bytes). This is the
// lenient rule the SPM/BPE symbol splitters use; it never returns 0.
size_t utf8_len_from_lead(uint8_t lead);

// Decodes the code point at s[pos] and advances pos past it. Lenient, like the
// reference tokenizers: structure (lead + continuation bits) is checked but
// overlong forms and surrogates are accepted. A malformed sequence yields
// U+FFFD and advances by one byte. Requires pos < s.size().
uint32_t decode_utf8(std::string_view s, size_t& pos);

// All code points of `s` (malformed bytes become U+FFFD, one per byte).
std::vector<uint32_t> utf8_to_codepoints(std::string_view s);

// Appends the UTF-8 encoding of cp; cp > U+10FFFF is written as U+FFFD.
void append_utf8(std::string& out, uint32_t cp);
std::string codepoint_to_utf8(uint32_t cp);

// Length of the longest prefix of `s` that does not end inside a UTF-8
// sequence that could still be completed by more bytes: a trailing lead byte
// plus fewer continuation bytes than it announces is excluded (at most 3
// bytes). Everything else, valid or not, is included.
size_t utf8_complete_prefix(std::string_view s);

// Replaces every malformed sequence of `s` by U+FFFD (one per maximal
// ill-formed subpart, as the WHATWG/Unicode "best practice" describes).
// Strict: overlong forms, surrogates and > U+10FFFF are malformed.
std::string sanitize_utf8(std::string_view s);

Category category(uint32_t cp);
bool is_whitespace(uint32_t cp);  // Unicode White_Space property
uint32_t to_lower(uint32_t cp);   // simple lowercase mapping; cp if none
// First code point of the canonical decomposition (e.g. U+00E9 -> U+0065);
// cp when it has none. Used for BERT-style accent stripping.
uint32_t nfd_base(uint32_t cp);

// Byte-level BPE (GPT-2) mapping: every byte is shown as one printable
// character (bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF as themselves, the other 68
// as U+0100.. in byte order). Returns the UTF-8 text of that character.
const std::string& byte_to_bpe_char(uint8_t byte);
// Inverse of byte_to_bpe_char on code points; -1 when cp is not one of the 256.
int bpe_char_to_byte(uint32_t cp);

// Version of the Unicode tables (for diagnostics).
const char* tables_version();

}  // namespace serval::unicode
