// Python str semantics on UTF-8 text, for the chat-template renderer.
//
// Jinja templates run Python string operations (strip, split, upper, slicing
// by code point, repr, str(float) ...). These helpers reproduce CPython's
// results on UTF-8 std::strings so that rendered prompts are byte-identical
// to Python's jinja2. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace serval::chat_template::py {

// --- code points ----------------------------------------------------------

std::vector<uint32_t> to_cps(std::string_view s);
std::string from_cps(const uint32_t* cps, size_t n);
inline std::string from_cps(const std::vector<uint32_t>& cps) { return from_cps(cps.data(), cps.size()); }
void append_cp(std::string& out, uint32_t cp);
bool is_ascii(std::string_view s);
size_t cp_count(std::string_view s);  // len(s)

// --- character classes (str.isspace(), str.isprintable(), ...) ------------

bool is_space(uint32_t cp);      // str.isspace(); also the \s of Python's re
bool is_printable(uint32_t cp);  // str.isprintable()
bool is_alpha(uint32_t cp);      // letters (category L)
bool is_alnum(uint32_t cp);      // letters and numbers (L, N)
bool is_digit(uint32_t cp);      // decimal digits 0-9 and other Nd (approximated by N)
bool is_linebreak(uint32_t cp);  // the boundaries of str.splitlines()
uint32_t to_lower(uint32_t cp);  // simple case mappings
uint32_t to_upper(uint32_t cp);
bool is_cased(uint32_t cp);
bool is_lower_cp(uint32_t cp);
bool is_upper_cp(uint32_t cp);

// --- str methods ----------------------------------------------------------

std::string lower(std::string_view s);
std::string upper(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
bool islower(std::string_view s);            // str.islower()
bool isupper(std::string_view s);            // str.isupper()

enum class StripSide { both, left, right };
// str.strip(chars): chars == nullopt strips whitespace (is_space).
std::string strip(std::string_view s, const std::optional<std::string>& chars, StripSide side = StripSide::both);

// str.split(sep, maxsplit) / str.rsplit: sep == nullopt splits on whitespace
// runs. An empty sep is an error in Python; the caller must reject it.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit = -1);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit = -1);
std::vector<std::string> splitlines(std::string_view s, bool keepends = false);

// str.replace(old, new, count); count < 0 means all.
std::string replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count = -1);
// str.find / rfind / count in code-point indices (-1 when absent).
int64_t find(std::string_view s, std::string_view sub, bool reverse = false);
int64_t count(std::string_view s, std::string_view sub);

// s[start:stop:step] with Python's index normalization, on code points.
std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step);
// s[i] (negative i counts from the end); nullopt when out of range.
std::optional<std::string> index(std::string_view s, int64_t i);

std::string center(std::string_view s, int64_t width);

// --- repr / str -----------------------------------------------------------

std::string repr_string(std::string_view s);  // repr(str): quotes and escapes
std::string float_repr(double d);             // repr(float) == str(float)
std::string html_escape(std::string_view s);  // markupsafe.escape

// Slices as Python computes them: normalizes (start, stop, step) for a
// sequence of length n into the list of selected indices' range parameters.
struct SliceRange {
  int64_t start = 0;
  int64_t step = 1;
  int64_t count = 0;  // number of selected elements
};
SliceRange slice_range(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step);

}  // namespace serval::chat_template::py
