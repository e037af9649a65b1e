#include "server/output_parser.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include <nlohmann/json.hpp>

namespace serval {

// --- reasoning ---

ReasoningSplitter::ReasoningSplitter(bool starts_inside, std::string open, std::string close)
    : open_(std::move(open)), close_(std::move(close)), inside_(starts_inside) {}

namespace {

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

bool only_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isspace((unsigned char)c); });
}

}  // namespace

ReasoningDelta ReasoningSplitter::feed(std::string_view text) {
  ReasoningDelta out;
  held_ += text;
  for (;;) {
    if (strip_) {
      size_t n = 0;
      while (n < held_.size() && (held_[n] == '\n' || held_[n] == '\r')) ++n;
      held_.erase(0, n);
      if (held_.empty()) return out;
      strip_ = false;
    }
    const std::string& tag = inside_ ? close_ : open_;
    const size_t at = held_.find(tag);
    if (at != std::string::npos) {
      const std::string before = held_.substr(0, at);
      if (inside_) {
        out.reasoning += before;
        inside_ = false;
        strip_ = true;  // the answer usually starts after a blank line: drop the leading newlines
        held_.erase(0, at + tag.size());
        continue;
      }
      if (!seen_content_ && only_space(before)) {
        inside_ = true;
        strip_ = true;
        held_.erase(0, at + tag.size());
        continue;
      }
    }
    // No (usable) tag: release all but a possible tag prefix at the end.
    const bool can_open = !inside_ && !seen_content_;
    const size_t keep = inside_ || can_open ? partial_suffix(held_, tag) : 0;
    // Leading space before a (possibly partial) <think> is held with it.
    const size_t keep_space =
        can_open && only_space(std::string_view(held_).substr(0, held_.size() - keep)) ? held_.size() : keep;
    const std::string ready = held_.substr(0, held_.size() - keep_space);
    if (inside_) out.reasoning += ready;
    else {
      out.content += ready;
      if (!ready.empty()) seen_content_ = true;
    }
    held_.erase(0, ready.size());
    return out;
  }
}

ReasoningDelta ReasoningSplitter::finish() {
  ReasoningDelta out;
  (inside_ ? out.reasoning : out.content) += held_;
  held_.clear();
  return out;
}

ReasoningDelta split_reasoning(std::string_view text, bool starts_inside) {
  ReasoningSplitter s(starts_inside);
  ReasoningDelta a = s.feed(text), b = s.finish();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

bool template_reasons(std::string_view src) {
  return src.find("<think>") != std::string_view::npos || src.find("</think>") != std::string_view::npos;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  size_t end = prompt.size();
  while (end > 0 && std::isspace((unsigned char)prompt[end - 1])) --end;
  const std::string_view t = prompt.substr(0, end);
  return t.size() >= 7 && t.substr(t.size() - 7) == "<think>";
}

// --- tool calls ---

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::none: return "none";
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::llama3_json: return "llama3_json";
    case ToolCallFormat::mistral: return "mistral";
    case ToolCallFormat::functionary31: return "functionary_v3.1";
    case ToolCallFormat::functionary32: return "functionary_v3.2";
    case ToolCallFormat::command_r: return "command_r";
    case ToolCallFormat::command_r7b: return "command_r7b";
    case ToolCallFormat::deepseek_r1: return "deepseek_r1";
    case ToolCallFormat::firefunction: return "firefunction_v2";
  }
  return "none";
}

ToolCallFormat detect_tool_call_format(std::string_view s) {
  auto has = [&](std::string_view x) { return s.find(x) != std::string_view::npos; };
  if (has("<｜tool▁calls▁begin｜>")) return ToolCallFormat::deepseek_r1;
  if (has("<|START_ACTION|>")) return ToolCallFormat::command_r7b;
  if (has("Action:") && has("tool_name")) return ToolCallFormat::command_r;
  if (has("functools[")) return ToolCallFormat::firefunction;
  if (has("[TOOL_CALLS]")) return ToolCallFormat::mistral;
  if (has("<function=")) return ToolCallFormat::functionary31;
  if (has(">>>all")) return ToolCallFormat::functionary32;
  if (has("<tool_call>")) return ToolCallFormat::hermes;
  if (has("<|python_tag|>") || (has("\"parameters\"") && has("<|start_header_id|>"))) return ToolCallFormat::llama3_json;
  return ToolCallFormat::none;
}

namespace {

enum class Scan { done, partial, bad };

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && std::isspace((unsigned char)s[i])) ++i;
  return i;
}

// One JSON value at i (no leading space): its end, or partial/bad.
Scan scan_value(std::string_view s, size_t i, size_t& end) {
  if (i >= s.size()) return Scan::partial;
  std::vector<char> stack;
  bool in_str = false, esc = false;
  const char c0 = s[i];
  if (c0 != '{' && c0 != '[' && c0 != '"') {
    // A scalar: up to a delimiter.
    size_t j = i;
    while (j < s.size() && (std::isalnum((unsigned char)s[j]) || s[j] == '-' || s[j] == '+' || s[j] == '.')) ++j;
    if (j == i) return Scan::bad;
    if (j == s.size()) return Scan::partial;
    end = j;
    return Scan::done;
  }
  for (size_t j = i; j < s.size(); ++j) {
    const char c = s[j];
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') {
        in_str = false;
        if (stack.empty()) return end = j + 1, Scan::done;
      }
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') stack.push_back(c);
    else if (c == '}' || c == ']') {
      if (stack.empty() || (c == '}' ? '{' : '[') != stack.back()) return Scan::bad;
      stack.pop_back();
      if (stack.empty()) return end = j + 1, Scan::done;
    }
  }
  return Scan::partial;
}

// A JSON string at i: its decoded value (escapes kept simple: \" \\ \n \t \/ and \uXXXX as is).
Scan scan_string(std::string_view s, size_t i, size_t& end, std::string& out) {
  if (i >= s.size()) return Scan::partial;
  if (s[i] != '"') return Scan::bad;
  out.clear();
  for (size_t j = i + 1; j < s.size(); ++j) {
    const char c = s[j];
    if (c == '\\') {
      if (j + 1 >= s.size()) return Scan::partial;
      const char e = s[++j];
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      continue;
    }
    if (c == '"') return end = j + 1, Scan::done;
    out += c;
  }
  return Scan::partial;
}

// One call object {.., "name": "f", .., "arguments": {..}, ..} at i.
struct CallScan {
  Scan state = Scan::bad;
  ToolCall call;
  bool have_name = false;
  size_t end = 0;  // done: one past the object's '}'
};

CallScan scan_call_object(std::string_view s, size_t i, const char* name_key, const char* args_key) {
  CallScan r;
  i = skip_ws(s, i);
  if (i >= s.size()) return r.state = Scan::partial, r;
  if (s[i] != '{') return r;
  i = skip_ws(s, i + 1);
  for (;;) {
    if (i >= s.size()) return r.state = Scan::partial, r;
    if (s[i] == '}') {
      if (!r.have_name) return r;
      r.end = i + 1;
      return r.state = Scan::done, r;
    }
    std::string key;
    size_t e;
    Scan st = scan_string(s, i, e, key);
    if (st != Scan::done) return r.state = st, r;
    i = skip_ws(s, e);
    if (i >= s.size()) return r.state = Scan::partial, r;
    if (s[i] != ':') return r;
    i = skip_ws(s, i + 1);
    if (i >= s.size()) return r.state = Scan::partial, r;
    if (key == name_key) {
      st = scan_string(s, i, e, r.call.name);
      if (st != Scan::done) return r.state = st, r;
      r.have_name = true;
    } else {
      st = scan_value(s, i, e);
      if (key == args_key) {
        if (!r.have_name) return r;  // the name comes first in every format here
        r.call.arguments = std::string(s.substr(i, st == Scan::done ? e - i : s.size() - i));
      }
      if (st != Scan::done) return r.state = st, r;
    }
    i = skip_ws(s, e);
    if (i < s.size() && s[i] == ',') i = skip_ws(s, i + 1);
  }
}

// Output of one format's scan: segments of text and calls; `settled` is how
// much of the text is decided (the rest may still become a call).
struct Scanned {
  ParsedOutput out;
  size_t settled = 0;    // bytes of `out.content` that are final
  bool partial_call = false;
};

struct Marker {
  std::string_view open, close;
};

bool known(const std::set<std::string>& names, const std::string& n) { return names.empty() || names.count(n) > 0; }

// A JSON array of call objects at i: [obj, obj, ...].
Scan scan_call_array(std::string_view s, size_t i, const char* nk, const char* ak, const std::set<std::string>& names,
                     std::vector<ToolCall>& calls, size_t& end) {
  i = skip_ws(s, i);
  if (i >= s.size()) return Scan::partial;
  if (s[i] != '[') return Scan::bad;
  i = skip_ws(s, i + 1);
  for (;;) {
    if (i >= s.size()) return Scan::partial;
    if (s[i] == ']') return end = i + 1, Scan::done;
    CallScan c = scan_call_object(s, i, nk, ak);
    if (c.state == Scan::bad || (c.have_name && !known(names, c.call.name))) return Scan::bad;
    if (c.have_name) calls.push_back(c.call);
    if (c.state == Scan::partial) return Scan::partial;
    i = skip_ws(s, c.end);
    if (i < s.size() && s[i] == ',') i = skip_ws(s, i + 1);
  }
}

// NAME<delim>ARGS (the name outside the JSON): one call into `calls` when
// the name is known; returns the args' scan state (end: past them).
Scan scan_named_call(std::string_view s, size_t i, char delim, const std::set<std::string>& names,
                     std::vector<ToolCall>& calls, size_t& end) {
  const size_t d = s.find(delim, i);
  if (d == std::string_view::npos) return s.size() - i > 128 ? Scan::bad : Scan::partial;
  ToolCall c{std::string(s.substr(i, d - i)), {}};
  if (c.name.empty() || c.name == "all" || !known(names, c.name)) return Scan::bad;
  i = skip_ws(s, d + 1);
  const Scan st = scan_value(s, i, end);
  if (st == Scan::bad) return Scan::bad;
  c.arguments = std::string(s.substr(i, st == Scan::done ? end - i : s.size() - i));
  calls.push_back(std::move(c));
  return st;
}

// The calls of one block at `start` (just after its opening marker); returns
// the scan state and, when done, the end of the block.
Scan scan_block(ToolCallFormat f, std::string_view s, size_t i, const std::set<std::string>& names,
                std::vector<ToolCall>& calls, size_t& end) {
  auto expect = [&](std::string_view lit) -> Scan {
    i = skip_ws(s, i);
    const size_t n = std::min(lit.size(), s.size() - std::min(i, s.size()));
    if (s.substr(i, n) != lit.substr(0, n)) return Scan::bad;
    if (n < lit.size()) return Scan::partial;
    i += lit.size();
    return Scan::done;
  };
  auto one = [&](const char* nk, const char* ak, std::string_view close) -> Scan {
    CallScan c = scan_call_object(s, i, nk, ak);
    if (c.state == Scan::bad || (c.have_name && !known(names, c.call.name))) return Scan::bad;
    if (c.have_name) calls.push_back(c.call);
    if (c.state == Scan::partial) return Scan::partial;
    i = c.end;
    if (!close.empty()) {
      const Scan st = expect(close);
      if (st != Scan::done) return st;
    }
    end = i;
    return Scan::done;
  };
  switch (f) {
    case ToolCallFormat::hermes: return one("name", "arguments", "</tool_call>");
    case ToolCallFormat::llama3_json: {
      CallScan c = scan_call_object(s, i, "name", "parameters");
      if (c.state == Scan::bad) c = scan_call_object(s, i, "name", "arguments");
      if (c.state == Scan::bad || (c.have_name && !known(names, c.call.name))) return Scan::bad;
      if (c.have_name) calls.push_back(c.call);
      if (c.state == Scan::partial) return Scan::partial;
      end = c.end;
      return Scan::done;
    }
    case ToolCallFormat::mistral:
    case ToolCallFormat::firefunction: return scan_call_array(s, i, "name", "arguments", names, calls, end);
    case ToolCallFormat::command_r7b: {
      Scan st = scan_call_array(s, i, "tool_name", "parameters", names, calls, end);
      if (st != Scan::done) return st;
      i = end;
      st = expect("<|END_ACTION|>");
      end = i;
      return st;
    }
    case ToolCallFormat::command_r: {
      Scan st = expect("```json");
      if (st != Scan::done) return st;
      st = scan_call_array(s, i, "tool_name", "parameters", names, calls, end);
      if (st != Scan::done) return st;
      i = end;
      st = expect("```");
      end = i;
      return st;
    }
    case ToolCallFormat::functionary31: {
      // NAME>{args}</function>
      const Scan st = scan_named_call(s, i, '>', names, calls, end);
      // The closing tag inside unfinished arguments: they are malformed.
      if (st == Scan::partial && s.find("</function>", i) != std::string_view::npos) return calls.clear(), Scan::bad;
      if (st != Scan::done) return st;
      i = end;
      const Scan cl = expect("</function>");
      end = i;
      return cl;
    }
    case ToolCallFormat::functionary32:  // NAME\n{args}
      return scan_named_call(s, i, '\n', names, calls, end);
    case ToolCallFormat::deepseek_r1: {
      // (<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{args}\n```<｜tool▁call▁end｜>)+ <｜tool▁calls▁end｜>
      for (;;) {
        i = skip_ws(s, i);
        Scan st = expect("<｜tool▁calls▁end｜>");
        if (st == Scan::done) return end = i, Scan::done;
        if (st == Scan::partial) return Scan::partial;
        if ((st = expect("<｜tool▁call▁begin｜>function<｜tool▁sep｜>")) != Scan::done) return st;
        const size_t nl = s.find('\n', i);
        if (nl == std::string_view::npos) return s.size() - i > 128 ? Scan::bad : Scan::partial;
        ToolCall c{std::string(s.substr(i, nl - i)), {}};
        if (c.name.empty() || !known(names, c.name)) return Scan::bad;
        i = nl + 1;
        if ((st = expect("```json")) != Scan::done) return st;
        i = skip_ws(s, i);
        size_t e;
        st = scan_value(s, i, e);
        if (st == Scan::bad) return Scan::bad;
        c.arguments = std::string(s.substr(i, st == Scan::done ? e - i : s.size() - i));
        calls.push_back(c);
        if (st == Scan::partial) return Scan::partial;
        i = e;
        if ((st = expect("```")) != Scan::done) return st;
        if ((st = expect("<｜tool▁call▁end｜>")) != Scan::done) return st;
      }
    }
    case ToolCallFormat::none: return Scan::bad;
  }
  return Scan::bad;
}

std::vector<std::string_view> open_markers(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::hermes: return {"<tool_call>"};
    case ToolCallFormat::llama3_json: return {"<|python_tag|>", "{"};
    case ToolCallFormat::mistral: return {"[TOOL_CALLS]"};
    case ToolCallFormat::firefunction: return {"functools"};
    case ToolCallFormat::functionary31: return {"<function="};
    case ToolCallFormat::functionary32: return {">>>"};
    case ToolCallFormat::command_r: return {"Action:"};
    case ToolCallFormat::command_r7b: return {"<|START_ACTION|>"};
    case ToolCallFormat::deepseek_r1: return {"<｜tool▁calls▁begin｜>"};
    case ToolCallFormat::none: return {};
  }
  return {};
}

// s = the implied prefix (its first `implied` bytes: what the prompt already
// wrote, e.g. Functionary v3.2's ">>>") + the output; text never includes the
// implied bytes.
Scanned scan_output(ToolCallFormat f, std::string_view s, const std::set<std::string>& names, bool final,
                    size_t implied = 0) {
  Scanned r;
  const auto markers = open_markers(f);
  auto text = [&](size_t from, size_t to) {
    from = std::max(from, implied);
    if (to > from) r.out.content += s.substr(from, to - from);
  };
  size_t pos = 0;
  while (pos < s.size()) {
    // The next opening marker (llama3_json: "{" only at the start of the output).
    size_t at = std::string_view::npos, mlen = 0;
    for (std::string_view m : markers) {
      size_t p = s.find(m, pos);
      if (f == ToolCallFormat::llama3_json && m == "{") {
        const size_t first = skip_ws(s, 0);
        p = (pos <= first && first < s.size() && s[first] == '{') ? first : std::string_view::npos;
      }
      if (p < at) at = p, mlen = m == "{" ? 0 : m.size();
    }
    if (at == std::string_view::npos) {
      // Hold back a possible marker start at the end.
      size_t hold = 0;
      if (!final)
        for (std::string_view m : markers)
          if (m != "{") hold = std::max(hold, partial_suffix(s.substr(pos), m));
      if (!final && f == ToolCallFormat::llama3_json && r.out.content.empty() && pos == 0 && only_space(s)) hold = s.size();
      text(pos, s.size() - hold);
      r.settled = r.out.content.size();
      return r;
    }
    text(pos, at);
    if (f == ToolCallFormat::functionary32) {
      // ">>>all\n" addresses the user: what follows is text.
      constexpr std::string_view kAll = "all\n";
      const std::string_view rest = s.substr(at + mlen);
      if (rest.substr(0, kAll.size()) == kAll) {
        pos = at + mlen + kAll.size();
        continue;
      }
      if (!final && rest.size() < kAll.size() && kAll.substr(0, rest.size()) == rest) {
        r.settled = r.out.content.size();
        return r;
      }
    }
    std::vector<ToolCall> calls;
    size_t end = 0;
    const Scan st = scan_block(f, s, at + mlen, names, calls, end);
    // Complete calls must carry JSON arguments; otherwise the block is text.
    bool valid = st == Scan::done;
    for (const ToolCall& c : calls)
      if (valid) valid = nlohmann::json::accept(c.arguments);
    if (valid) {
      r.out.calls.insert(r.out.calls.end(), calls.begin(), calls.end());
      pos = end;
      continue;
    }
    if (st == Scan::partial) {
      r.settled = r.out.content.size();
      // A call cut off by the end of the output still counts once its name is known.
      r.out.calls.insert(r.out.calls.end(), calls.begin(), calls.end());
      r.partial_call = true;
      if (final && calls.empty()) text(at, s.size());
      if (final) r.settled = r.out.content.size();
      return r;
    }
    if (st == Scan::done) {
      // Arguments that are not JSON: the whole block is text.
      text(at, end);
      pos = end;
      continue;
    }
    // Not a call after all: the marker is text.
    const size_t step = std::max<size_t>(mlen, 1);
    text(at, at + step);
    pos = at + step;
  }
  r.settled = r.out.content.size();
  return r;
}

}  // namespace

ParsedOutput parse_tool_calls(ToolCallFormat f, std::string_view text, const std::set<std::string>& names,
                              std::string_view implied_prefix) {
  if (f == ToolCallFormat::none) return {std::string(text), {}};
  const std::string full = std::string(implied_prefix) + std::string(text);
  ParsedOutput out = scan_output(f, full, names, true, implied_prefix.size()).out;
  if (!out.calls.empty()) {
    // Whitespace around calls is layout, not an answer.
    if (only_space(out.content)) out.content.clear();
  }
  return out;
}

ToolCallStreamer::ToolCallStreamer(ToolCallFormat f, std::set<std::string> names, std::string implied_prefix)
    : f_(f), names_(std::move(names)), text_(implied_prefix), implied_(implied_prefix.size()) {}

ToolCallDelta ToolCallStreamer::diff(const ParsedOutput& now, size_t content_ready) {
  ToolCallDelta d;
  if (content_ready > sent_content_) {
    d.content = now.content.substr(sent_content_, content_ready - sent_content_);
    sent_content_ = content_ready;
  }
  for (size_t k = 0; k < now.calls.size(); ++k) {
    if (k >= sent_args_.size()) {
      sent_args_.push_back(0);
      d.calls.push_back({k, now.calls[k].name, {}});
    }
    const std::string& a = now.calls[k].arguments;
    if (a.size() > sent_args_[k]) {
      if (d.calls.empty() || d.calls.back().index != k) d.calls.push_back({k, {}, {}});
      d.calls.back().arguments = a.substr(sent_args_[k]);
      sent_args_[k] = a.size();
    }
  }
  return d;
}

ToolCallDelta ToolCallStreamer::feed(std::string_view text) {
  text_ += text;
  if (f_ == ToolCallFormat::none) {
    ToolCallDelta d;
    d.content = std::string(text);
    sent_content_ += text.size();
    return d;
  }
  Scanned s = scan_output(f_, text_, names_, false, implied_);
  // Leading whitespace before a call is not sent until it is known to be text.
  size_t ready = s.settled;
  if (only_space(std::string_view(s.out.content).substr(0, ready))) ready = sent_content_;
  return diff(s.out, ready);
}

ToolCallDelta ToolCallStreamer::finish() {
  if (f_ == ToolCallFormat::none) return {};
  ParsedOutput p = parse_tool_calls(f_, std::string_view(text_).substr(implied_), names_, text_.substr(0, implied_));
  return diff(p, p.content.size());
}

}  // namespace serval
