// Nesting depth of a JSON text, computed without parsing it, so that deeply
// nested input can be refused before any recursive parser sees it.
#pragma once

#include <algorithm>
#include <string_view>

namespace serval {

// Maximum nesting of [ ] and { } outside strings.
inline int json_nesting_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_str = false, esc = false;
  for (char c : text) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return max_depth;
}

}  // namespace serval
