// jinja2's builtin filters (3.1 semantics), with Hugging Face's tojson.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_set>

#include "tokenizer/chat_template/builtins.h"
#include "tokenizer/chat_template/evaluator.h"
#include "tokenizer/chat_template/py_string.h"
#include "tokenizer/unicode.h"

namespace serval::chat_template {

void bind_args(const char* fname, CallArgs& args, std::initializer_list<const char*> names,
               std::optional<Value>* out) {
  size_t n = names.size();
  if (args.pos.size() > n) {
    fail(std::string(fname) + "() takes at most " + std::to_string(n) + " argument(s) (" +
         std::to_string(args.pos.size()) + " given)");
  }
  for (size_t i = 0; i < args.pos.size(); ++i) out[i] = args.pos[i];
  for (auto& [k, v] : args.kw) {
    size_t idx = 0;
    bool found = false;
    for (const char* name : names) {
      if (k == name) {
        found = true;
        break;
      }
      ++idx;
    }
    if (!found) fail(std::string(fname) + "() got an unexpected keyword argument '" + k + "'");
    if (out[idx]) fail(std::string(fname) + "() got multiple values for argument '" + k + "'");
    out[idx] = v;
  }
}

namespace {

// --- helpers -----------------------------------------------------------------------------

struct SoftStr {
  std::string s;
  bool safe = false;
};

// jinja2's soft_str: Markup stays Markup, anything else becomes str(value).
SoftStr soft_str(const Value& v) {
  if (v.is_string()) return {v.str(), v.safe()};
  return {to_str(v), false};
}

int64_t int_arg(const std::optional<Value>& v, int64_t dflt, const char* what) {
  if (!v || v->is_none()) return dflt;
  if (v->is_int() || v->is_bool()) return v->as_int();
  if (v->is_undefined()) fail_undefined(*v);
  fail(std::string("'") + type_name(*v) + "' object cannot be interpreted as an integer (" + what + ")");
}

bool bool_arg(const std::optional<Value>& v, bool dflt) { return v ? truthy(*v) : dflt; }

std::string str_arg(const std::optional<Value>& v, const std::string& dflt) {
  if (!v) return dflt;
  return soft_str(*v).s;
}

Value lower_if_str(Evaluator& ev, const Value& v) {
  if (v.is_string()) return ev.make_string(py::lower(v.str()), v.safe());
  return v;
}

// make_attrgetter: "a.b.0" looked up with subscript semantics, step by step.
struct AttrPath {
  std::vector<Value> parts;
};

AttrPath parse_attr(const std::optional<Value>& attribute) {
  AttrPath p;
  if (!attribute || attribute->is_none()) return p;
  if (attribute->is_string()) {
    for (const std::string& part : py::split(attribute->str(), std::string("."))) {
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits && part.size() < 18) {
        p.parts.push_back(Value::integer(std::stoll(part)));
      } else {
        p.parts.push_back(Value::string(part));
      }
    }
  } else {
    p.parts.push_back(*attribute);
  }
  return p;
}

Value get_path(Evaluator& ev, Value item, const AttrPath& p, const Value* dflt = nullptr) {
  for (const Value& part : p.parts) {
    item = ev.getitem(item, part);
    if (dflt && item.is_undefined()) item = *dflt;
  }
  return item;
}

bool key_less(const std::vector<Value>& a, const std::vector<Value>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!equals(a[i], b[i])) return less(a[i], b[i]);
  }
  return a.size() < b.size();
}

void check_iterable(const Value& v) {
  if (!(v.is_list() || v.is_dict() || v.is_string() || v.is_undefined())) {
    fail(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

Value iterator(Evaluator& ev, std::vector<Value> items) { return ev.make_list(std::move(items), Seq::iterator); }

// --- filters ------------------------------------------------------------------------------

Value f_abs(Evaluator&, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("abs", a, {}, x);
  if (v.is_int() || v.is_bool()) {
    int64_t i = v.as_int();
    if (i == INT64_MIN) fail("integer overflow");
    return Value::integer(i < 0 ? -i : i);
  }
  if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
  if (v.is_undefined()) fail_undefined(v);
  fail(std::string("bad operand type for abs(): '") + type_name(v) + "'");
}

Value f_attr(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("attr", a, {"name"}, x);
  if (!x[0] || !x[0]->is_string()) fail("attr(): attribute name must be a string");
  const std::string& name = x[0]->str();
  if (v.is_dict() || v.is_string() || v.is_list()) {
    if (name.rfind("__", 0) == 0) return Value::undefined("access to attribute '" + name + "' is unsafe.");
    if (auto m = find_method(v, name)) return *m;
    return Value::undefined("'" + std::string(type_name(v)) + " object' has no attribute '" + name + "'");
  }
  return ev.getattr(v, name);
}

Value f_batch(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("batch", a, {"linecount", "fill_with"}, x);
  int64_t n = int_arg(x[0], 0, "linecount");
  if (n <= 0) fail("batch(): linecount must be positive");
  check_iterable(v);
  std::vector<Value> out, tmp;
  for (Value& item : ev.iter(v)) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(ev.make_list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(std::move(item));
  }
  if (!tmp.empty()) {
    if (x[1] && !x[1]->is_none()) {
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(*x[1]);
    }
    out.push_back(ev.make_list(std::move(tmp)));
  }
  return iterator(ev, std::move(out));
}

Value f_capitalize(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("capitalize", a, {}, x);
  SoftStr s = soft_str(v);
  return ev.make_string(py::capitalize(s.s), s.safe);
}

Value f_center(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("center", a, {"width"}, x);
  int64_t w = int_arg(x[0], 80, "width");
  ev.check_string_size(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(w, INT32_MAX))));
  SoftStr s = soft_str(v);
  return ev.make_string(py::center(s.s, w), s.safe);
}

Value f_length(Evaluator&, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("length", a, {}, x);
  return Value::integer(length(v));
}

Value f_default(Evaluator&, const Value& v, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("default", a, {"default_value", "boolean"}, x);
  if (v.is_undefined() || (bool_arg(x[1], false) && !truthy(v))) return x[0] ? *x[0] : Value::string("");
  return v;
}

Value f_dictsort(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[3];
  bind_args("dictsort", a, {"case_sensitive", "by", "reverse"}, x);
  bool cs = bool_arg(x[0], false);
  std::string by = str_arg(x[1], "key");
  bool rev = bool_arg(x[2], false);
  size_t pos;
  if (by == "key") {
    pos = 0;
  } else if (by == "value") {
    pos = 1;
  } else {
    fail("You can only sort by either \"key\" or \"value\"");
  }
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_dict()) fail(std::string("'") + type_name(v) + "' object has no attribute 'items'");
  struct Item {
    Value pair;
    Value key;
  };
  std::vector<Item> items;
  for (const auto& [k, val] : v.dict().items) {
    Value pair = ev.make_list({k, val}, Seq::tuple);
    Value key = pos == 0 ? k : val;
    if (!cs) key = lower_if_str(ev, key);
    items.push_back({std::move(pair), std::move(key)});
  }
  std::stable_sort(items.begin(), items.end(), [&](const Item& p, const Item& q) {
    return rev ? less(q.key, p.key) : less(p.key, q.key);
  });
  std::vector<Value> out;
  for (auto& it : items) out.push_back(std::move(it.pair));
  return ev.make_list(std::move(out));
}

Value f_escape(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("escape", a, {}, x);
  if (v.is_string() && v.safe()) return v;
  return ev.make_string(py::html_escape(to_str(v)), true);
}

Value f_forceescape(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("forceescape", a, {}, x);
  return ev.make_string(py::html_escape(to_str(v)), true);
}

Value f_first(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("first", a, {}, x);
  check_iterable(v);
  if (v.is_list()) {
    if (v.list().items.empty()) return Value::undefined("No first item, sequence was empty.");
    return v.list().items.front();
  }
  if (v.is_string()) {
    auto c = py::index(v.str(), 0);
    if (!c) return Value::undefined("No first item, sequence was empty.");
    return ev.make_string(std::move(*c), v.safe());
  }
  std::vector<Value> items = ev.iter(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("last", a, {}, x);
  if (v.is_list() && v.seq() == Seq::iterator) fail("'generator' object is not reversible");
  check_iterable(v);
  if (v.is_list()) {
    if (v.list().items.empty()) return Value::undefined("No last item, sequence was empty.");
    return v.list().items.back();
  }
  if (v.is_string()) {
    auto c = py::index(v.str(), -1);
    if (!c) return Value::undefined("No last item, sequence was empty.");
    return ev.make_string(std::move(*c), v.safe());
  }
  std::vector<Value> items = ev.iter(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python float(str); nullopt when it does not parse.
std::optional<double> parse_py_float(const std::string& raw) {
  std::string s = py::strip(raw, std::nullopt);
  std::string lower = py::lower(s);
  std::string body = lower;
  double sign = 1;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    if (body[0] == '-') sign = -1;
    body = body.substr(1);
  }
  if (body == "inf" || body == "infinity") return sign * HUGE_VAL;
  if (body == "nan") return std::nan("");
  // digits with single underscores between digits, '.', exponent
  std::string clean;
  bool prev_digit = false;
  bool any_digit = false;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c >= '0' && c <= '9') {
      clean.push_back(c);
      prev_digit = true;
      any_digit = true;
    } else if (c == '_') {
      if (!prev_digit || i + 1 >= body.size() || !(body[i + 1] >= '0' && body[i + 1] <= '9')) return std::nullopt;
      prev_digit = false;
    } else if (c == '.' || c == 'e' || c == '+' || c == '-') {
      clean.push_back(c);
      prev_digit = false;
    } else {
      return std::nullopt;
    }
  }
  if (!any_digit) return std::nullopt;
  // Validate the shape: digits [. digits] [e [+-] digits]
  size_t i = 0, n = clean.size();
  size_t d1 = 0, d2 = 0;
  while (i < n && std::isdigit(static_cast<unsigned char>(clean[i]))) ++i, ++d1;
  if (i < n && clean[i] == '.') {
    ++i;
    while (i < n && std::isdigit(static_cast<unsigned char>(clean[i]))) ++i, ++d2;
  }
  if (d1 + d2 == 0) return std::nullopt;
  if (i < n && clean[i] == 'e') {
    ++i;
    if (i < n && (clean[i] == '+' || clean[i] == '-')) ++i;
    size_t d3 = 0;
    while (i < n && std::isdigit(static_cast<unsigned char>(clean[i]))) ++i, ++d3;
    if (!d3) return std::nullopt;
  }
  if (i != n) return std::nullopt;
  return sign * std::strtod(clean.c_str(), nullptr);
}

// Python int(str, base); nullopt when it does not parse (or overflows int64).
std::optional<int64_t> parse_py_int(const std::string& raw, int base) {
  std::string s = py::strip(raw, std::nullopt);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    neg = s[i] == '-';
    ++i;
  }
  if (i + 1 < s.size() && s[i] == '0') {
    char p = static_cast<char>(s[i + 1] | 0x20);
    if ((p == 'x' && (base == 16 || base == 0)) || (p == 'o' && (base == 8 || base == 0)) ||
        (p == 'b' && (base == 2 || base == 0))) {
      base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size()) return std::nullopt;
  __int128 v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'z') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'Z') {
      d = c - 'A' + 10;
    } else if (c == '_' && prev_digit && i + 1 < s.size()) {
      prev_digit = false;
      continue;
    } else {
      return std::nullopt;
    }
    if (d >= base) return std::nullopt;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) return std::nullopt;
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  if (neg) v = -v;
  if (v > INT64_MAX || v < INT64_MIN) return std::nullopt;
  return static_cast<int64_t>(v);
}

Value f_float(Evaluator&, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("float", a, {"default"}, x);
  Value dflt = x[0] ? *x[0] : Value::floating(0.0);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.is_string()) {
    if (auto d = parse_py_float(v.str())) return Value::floating(*d);
  }
  return dflt;
}

Value f_int(Evaluator&, const Value& v, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("int", a, {"default", "base"}, x);
  Value dflt = x[0] ? *x[0] : Value::integer(0);
  int64_t base = int_arg(x[1], 10, "base");
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  auto from_double = [&](double d) -> Value {
    if (std::isnan(d)) return dflt;
    if (std::isinf(d)) fail("cannot convert float infinity to integer");
    double t = std::trunc(d);
    if (t >= 9.2233720368547758e18 || t < -9.2233720368547758e18) fail("integer overflow");
    return Value::integer(static_cast<int64_t>(t));
  };
  if (v.is_float()) return from_double(v.as_double());
  if (v.is_string()) {
    if (base != 0 && (base < 2 || base > 36)) fail("int() base must be >= 2 and <= 36, or 0");
    if (auto i = parse_py_int(v.str(), static_cast<int>(base))) return Value::integer(*i);
    if (auto d = parse_py_float(v.str())) return from_double(*d);
  }
  return dflt;
}

Value f_format(Evaluator& ev, const Value& v, CallArgs& a) {
  Value args;
  if (!a.kw.empty()) {
    auto d = std::make_shared<DictData>();
    for (auto& [k, val] : a.kw) d->set(Value::string(k), val);
    args = ev.make_dict(std::move(d));
  } else {
    args = ev.make_list(a.pos, Seq::tuple);
  }
  SoftStr s = soft_str(v);
  return py_percent_format(ev, Value::string(s.s, s.safe), args);
}

Value f_groupby(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[3];
  bind_args("groupby", a, {"attribute", "default", "case_sensitive"}, x);
  AttrPath path = parse_attr(x[0]);
  bool cs = bool_arg(x[2], false);
  const Value* dflt = (x[1] && !x[1]->is_none()) ? &*x[1] : nullptr;
  check_iterable(v);
  struct Item {
    Value item;
    Value key;
  };
  std::vector<Item> items;
  for (Value& it : ev.iter(v)) {
    Value key = get_path(ev, it, path, dflt);
    if (!cs) key = lower_if_str(ev, key);
    items.push_back({std::move(it), std::move(key)});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& p, const Item& q) { return less(p.key, q.key); });
  std::vector<Value> out;
  size_t i = 0;
  while (i < items.size()) {
    size_t j = i;
    std::vector<Value> group;
    while (j < items.size() && equals(items[j].key, items[i].key)) group.push_back(items[j++].item);
    Value grouper = cs ? items[i].key : get_path(ev, group.front(), path, dflt);
    Value tuple = ev.make_list({grouper, ev.make_list(std::move(group))}, Seq::tuple);
    const_cast<ListData&>(tuple.list()).group_tuple = true;
    out.push_back(std::move(tuple));
    i = j;
  }
  return ev.make_list(std::move(out));
}

Value f_indent(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[3];
  bind_args("indent", a, {"width", "first", "blank"}, x);
  std::string indention;
  if (x[0] && x[0]->is_string()) {
    indention = x[0]->str();
  } else {
    int64_t w = int_arg(x[0], 4, "width");
    ev.check_string_size(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(w, INT32_MAX))));
    indention.assign(static_cast<size_t>(std::max<int64_t>(0, w)), ' ');
  }
  bool first = bool_arg(x[1], false);
  bool blank = bool_arg(x[2], false);
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) fail(std::string("unsupported operand type(s) for +=: '") + type_name(v) + "' and 'str'");
  std::vector<std::string> lines = py::splitlines(v.str() + "\n");
  std::string rv;
  auto add = [&](std::string_view piece) {
    ev.check_string_size(rv.size() + piece.size());
    rv.append(piece);
  };
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) {
        add("\n");
        add(indention);
      }
      add(lines[i]);
    }
  } else {
    if (!lines.empty()) add(lines[0]);
    for (size_t i = 1; i < lines.size(); ++i) {
      add("\n");
      if (!lines[i].empty()) add(indention);
      add(lines[i]);
    }
  }
  if (first) rv = indention + rv;
  return ev.make_string(std::move(rv), v.safe());
}

Value f_items(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("items", a, {}, x);
  if (v.is_undefined()) return iterator(ev, {});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict().items) out.push_back(ev.make_list({k, val}, Seq::tuple));
  return iterator(ev, std::move(out));
}

Value f_join(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("join", a, {"d", "attribute"}, x);
  std::string d = x[0] ? to_str(*x[0]) : std::string();
  AttrPath path = parse_attr(x[1]);
  check_iterable(v);
  std::string out;
  bool first = true;
  for (Value& item : ev.iter(v)) {
    if (!first) out += d;
    first = false;
    Value it = x[1] ? get_path(ev, item, path) : item;
    if (it.is_string()) {
      out += it.str();
    } else {
      out += to_str(it);
    }
    ev.check_string_size(out.size());
  }
  return ev.make_string(std::move(out));
}

Value f_list(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("list", a, {}, x);
  check_iterable(v);
  return ev.make_list(ev.iter(v));
}

Value f_lower(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("lower", a, {}, x);
  SoftStr s = soft_str(v);
  return ev.make_string(py::lower(s.s), s.safe);
}

Value f_upper(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("upper", a, {}, x);
  SoftStr s = soft_str(v);
  return ev.make_string(py::upper(s.s), s.safe);
}

Value f_map(Evaluator& ev, const Value& v, CallArgs& a) {
  if (!truthy(v)) return iterator(ev, {});
  check_iterable(v);
  std::vector<Value> out;
  bool by_attr = a.pos.empty() && std::any_of(a.kw.begin(), a.kw.end(), [](auto& kv) { return kv.first == "attribute"; });
  if (by_attr) {
    std::optional<Value> attr, dflt;
    for (auto& [k, val] : a.kw) {
      if (k == "attribute") {
        attr = val;
      } else if (k == "default") {
        dflt = val;
      } else {
        fail("Unexpected keyword argument '" + k + "'");
      }
    }
    AttrPath path = parse_attr(attr);
    const Value* d = (dflt && !dflt->is_none()) ? &*dflt : nullptr;
    for (Value& item : ev.iter(v)) out.push_back(get_path(ev, item, path, d));
    return iterator(ev, std::move(out));
  }
  if (a.pos.empty()) fail("map requires a filter argument");
  Value name = a.pos[0];
  if (!name.is_string()) fail("map(): filter name must be a string");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (Value& item : ev.iter(v)) {
    CallArgs call = rest;
    out.push_back(ev.call_filter(name.str(), item, call));
  }
  return iterator(ev, std::move(out));
}

Value min_max(Evaluator& ev, const Value& v, CallArgs& a, bool is_max, const char* fname) {
  std::optional<Value> x[2];
  bind_args(fname, a, {"case_sensitive", "attribute"}, x);
  bool cs = bool_arg(x[0], false);
  AttrPath path = parse_attr(x[1]);
  check_iterable(v);
  std::vector<Value> items = ev.iter(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = get_path(ev, items[i], path);
    if (!cs) key = lower_if_str(ev, key);
    if (i == 0) {
      best_key = key;
      continue;
    }
    if (is_max ? less(best_key, key) : less(key, best_key)) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

Value f_max(Evaluator& ev, const Value& v, CallArgs& a) { return min_max(ev, v, a, true, "max"); }
Value f_min(Evaluator& ev, const Value& v, CallArgs& a) { return min_max(ev, v, a, false, "min"); }

Value select_impl(Evaluator& ev, const Value& v, CallArgs& a, bool select, bool by_attr) {
  if (!truthy(v)) return iterator(ev, {});
  check_iterable(v);
  size_t off = 0;
  AttrPath path;
  if (by_attr) {
    if (a.pos.empty()) fail("Missing parameter for attribute name");
    path = parse_attr(a.pos[0]);
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs targs;
  if (a.pos.size() > off) {
    if (!a.pos[off].is_string()) fail("test name must be a string");
    test = a.pos[off].str();
    targs.pos.assign(a.pos.begin() + static_cast<long>(off) + 1, a.pos.end());
    targs.kw = a.kw;
  }
  std::vector<Value> out;
  for (Value& item : ev.iter(v)) {
    Value subject = by_attr ? get_path(ev, item, path) : item;
    bool r;
    if (test) {
      CallArgs call = targs;
      r = ev.call_test(*test, subject, call);
    } else {
      r = truthy(subject);
    }
    if (r == select) out.push_back(std::move(item));
  }
  return iterator(ev, std::move(out));
}

Value f_select(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, false); }
Value f_reject(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, false); }
Value f_selectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, true); }
Value f_rejectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, true); }

Value f_replace(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[3];
  bind_args("replace", a, {"old", "new", "count"}, x);
  if (!x[0] || !x[1]) fail("replace() missing required argument");
  std::string s = to_str(v);
  std::string old_s = to_str(*x[0]);
  std::string new_s = to_str(*x[1]);
  int64_t count = int_arg(x[2], -1, "count");
  // Bound the result before building it.
  int64_t hits = old_s.empty() ? static_cast<int64_t>(py::cp_count(s)) + 1 : py::count(s, old_s);
  if (count >= 0) hits = std::min(hits, count);
  if (new_s.size() > old_s.size()) {
    ev.check_string_size(s.size() + static_cast<size_t>(hits) * (new_s.size() - old_s.size()));
  }
  return ev.make_string(py::replace(s, old_s, new_s, count));
}

Value f_reverse(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("reverse", a, {}, x);
  if (v.is_string()) return ev.make_string(py::slice(v.str(), std::nullopt, std::nullopt, -1), v.safe());
  check_iterable(v);
  std::vector<Value> items = ev.iter(v);
  std::reverse(items.begin(), items.end());
  if (v.is_list() && v.seq() == Seq::iterator) return ev.make_list(std::move(items));
  return iterator(ev, std::move(items));
}

Value f_round(Evaluator&, const Value& v, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("round", a, {"precision", "method"}, x);
  int64_t precision = int_arg(x[0], 0, "precision");
  std::string method = str_arg(x[1], "common");
  if (method != "common" && method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) fail(std::string("type ") + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) {
      int64_t i = v.as_int();
      if (precision >= 0) return Value::integer(i);
      // round half to even at 10^-precision
      if (precision < -18) return Value::integer(0);
      int64_t p = 1;
      for (int64_t k = 0; k < -precision; ++k) p *= 10;
      int64_t q = i / p, r = i % p;
      if (r < 0) {
        r += p;
        --q;
      }
      if (2 * r > p || (2 * r == p && (q % 2 != 0))) ++q;
      return Value::integer(q * p);
    }
    double d = v.as_double();
    if (!std::isfinite(d)) return Value::floating(d);
    if (precision >= 0) {
      if (precision > 330) return Value::floating(d);
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), d);
      return Value::floating(std::strtod(buf, nullptr));
    }
    double p = std::pow(10.0, static_cast<double>(-precision));
    double y = std::nearbyint(d / p) * p;  // round half to even
    return Value::floating(y);
  }
  double p = std::pow(10.0, static_cast<double>(precision));
  double d = v.as_double() * p;
  d = method == "ceil" ? std::ceil(d) : std::floor(d);
  return Value::floating(d / p);
}

Value f_safe(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("safe", a, {}, x);
  if (v.is_string()) return ev.make_string(v.str(), true);
  return ev.make_string(to_str(v), true);
}

Value f_slice(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("slice", a, {"slices", "fill_with"}, x);
  int64_t slices = int_arg(x[0], 0, "slices");
  if (slices <= 0) fail("slice(): slices must be positive");
  if (slices > 100000) fail_budget("slice(): too many slices");
  check_iterable(v);
  std::vector<Value> seq = ev.iter(v);
  int64_t length = static_cast<int64_t>(seq.size());
  int64_t per = length / slices, extra = length % slices, offset = 0;
  std::vector<Value> out;
  for (int64_t n = 0; n < slices; ++n) {
    int64_t start = offset + n * per;
    if (n < extra) ++offset;
    int64_t end = offset + (n + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (x[1] && !x[1]->is_none() && n >= extra) tmp.push_back(*x[1]);
    out.push_back(ev.make_list(std::move(tmp)));
  }
  return iterator(ev, std::move(out));
}

Value f_sort(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[3];
  bind_args("sort", a, {"reverse", "case_sensitive", "attribute"}, x);
  bool rev = bool_arg(x[0], false);
  bool cs = bool_arg(x[1], false);
  std::vector<AttrPath> paths;
  if (x[2] && x[2]->is_string()) {
    for (const std::string& part : py::split(x[2]->str(), std::string(","))) {
      paths.push_back(parse_attr(Value::string(part)));
    }
  } else {
    paths.push_back(parse_attr(x[2]));
  }
  check_iterable(v);
  struct Item {
    Value item;
    std::vector<Value> key;
  };
  std::vector<Item> items;
  for (Value& it : ev.iter(v)) {
    std::vector<Value> key;
    for (const AttrPath& p : paths) {
      Value k = get_path(ev, it, p);
      if (!cs) k = lower_if_str(ev, k);
      key.push_back(std::move(k));
    }
    items.push_back({std::move(it), std::move(key)});
  }
  std::stable_sort(items.begin(), items.end(), [&](const Item& p, const Item& q) {
    return rev ? key_less(q.key, p.key) : key_less(p.key, q.key);
  });
  std::vector<Value> out;
  for (auto& it : items) out.push_back(std::move(it.item));
  return ev.make_list(std::move(out));
}

Value f_string(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("string", a, {}, x);
  if (v.is_string()) return v;
  return ev.make_string(to_str(v));
}

Value f_sum(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("sum", a, {"attribute", "start"}, x);
  AttrPath path = parse_attr(x[0]);
  Value total = x[1] ? *x[1] : Value::integer(0);
  check_iterable(v);
  for (Value& item : ev.iter(v)) {
    Value it = x[0] ? get_path(ev, item, path) : item;
    if (it.is_undefined()) fail_undefined(it);
    if (total.is_number() && it.is_number()) {
      if (!total.is_float() && !it.is_float()) {
        int64_t r;
        if (__builtin_add_overflow(total.as_int(), it.as_int(), &r)) fail("integer overflow");
        total = Value::integer(r);
      } else {
        total = Value::floating(total.as_double() + it.as_double());
      }
    } else if (total.is_list() && it.is_list() && total.seq() == it.seq() && total.seq() != Seq::iterator) {
      std::vector<Value> out = total.list().items;
      out.insert(out.end(), it.list().items.begin(), it.list().items.end());
      total = ev.make_list(std::move(out), total.seq());
    } else {
      fail(std::string("unsupported operand type(s) for +: '") + type_name(total) + "' and '" + type_name(it) + "'");
    }
  }
  return total;
}

bool is_title_sep(uint32_t cp) {
  return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py::is_space(cp);
}

Value f_title(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("title", a, {}, x);
  std::vector<uint32_t> cps = py::to_cps(soft_str(v).s);
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    bool sep = is_title_sep(cps[i]);
    size_t j = i;
    while (j < cps.size() && is_title_sep(cps[j]) == sep) ++j;
    out += py::upper(py::from_cps(&cps[i], 1));  // item[0].upper() + item[1:].lower()
    out += py::lower(py::from_cps(cps.data() + i + 1, j - i - 1));
    i = j;
  }
  return ev.make_string(std::move(out));
}

Value f_tojson(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[4];
  bind_args("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"}, x);
  JsonDumpOptions o;
  o.ensure_ascii = bool_arg(x[0], false);
  if (x[1] && !x[1]->is_none()) {
    o.pretty = true;
    if (x[1]->is_string()) {
      o.indent = x[1]->str();
    } else if (x[1]->is_int() || x[1]->is_bool()) {
      int64_t n = x[1]->as_int();
      if (n > 1024) fail_budget("tojson(): indent too large");
      o.indent.assign(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
    } else {
      fail(std::string("can't multiply sequence by non-int of type '") + type_name(*x[1]) + "'");
    }
    o.item_sep = ",";
  }
  if (x[2] && !x[2]->is_none()) {
    if (!x[2]->is_list() || x[2]->seq() == Seq::iterator || x[2]->list().items.size() != 2 ||
        !x[2]->list().items[0].is_string() || !x[2]->list().items[1].is_string()) {
      fail("tojson(): separators must be a pair of strings");
    }
    o.item_sep = x[2]->list().items[0].str();
    o.key_sep = x[2]->list().items[1].str();
  }
  o.sort_keys = bool_arg(x[3], false);
  return ev.make_string(json_dumps(ev, v, o));
}

Value f_trim(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("trim", a, {"chars"}, x);
  SoftStr s = soft_str(v);
  std::optional<std::string> chars;
  if (x[0] && !x[0]->is_none()) {
    if (!x[0]->is_string()) fail("strip arg must be None or str");
    chars = x[0]->str();
  }
  return ev.make_string(py::strip(s.s, chars), s.safe);
}

Value f_truncate(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[4];
  bind_args("truncate", a, {"length", "killwords", "end", "leeway"}, x);
  int64_t length = int_arg(x[0], 255, "length");
  bool killwords = bool_arg(x[1], false);
  std::string end = str_arg(x[2], "...");
  int64_t leeway = int_arg(x[3], 5, "leeway");
  int64_t end_len = static_cast<int64_t>(py::cp_count(end));
  if (length < end_len) fail("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) fail("expected leeway >= 0, got " + std::to_string(leeway));
  std::string s = soft_str(v).s;
  if (static_cast<int64_t>(py::cp_count(s)) <= length + leeway) return ev.make_string(std::move(s));
  std::string head = py::slice(s, std::nullopt, length - end_len, 1);
  if (killwords) return ev.make_string(head + end);
  std::vector<std::string> parts = py::rsplit(head, std::string(" "), 1);
  return ev.make_string(parts[0] + end);
}

Value f_unique(Evaluator& ev, const Value& v, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("unique", a, {"case_sensitive", "attribute"}, x);
  bool cs = bool_arg(x[0], false);
  AttrPath path = parse_attr(x[1]);
  check_iterable(v);
  std::unordered_set<std::string> seen;
  std::vector<Value> out;
  for (Value& item : ev.iter(v)) {
    Value key = get_path(ev, item, path);
    if (!cs) key = lower_if_str(ev, key);
    if (seen.insert(hash_key(key)).second) out.push_back(std::move(item));
  }
  return iterator(ev, std::move(out));
}

Value f_wordcount(Evaluator&, const Value& v, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("wordcount", a, {}, x);
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t cp : py::to_cps(soft_str(v).s)) {
    bool w = cp == '_' || py::is_alnum(cp);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

struct FilterEntry {
  const char* name;
  FilterFn fn;
};

const FilterEntry kFilters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_forceescape},
    {"format", f_format},
    {"groupby", f_groupby},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"slice", f_slice},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

// --- json.dumps -------------------------------------------------------------------------------

class JsonWriter {
 public:
  JsonWriter(Evaluator& ev, const JsonDumpOptions& o) : ev_(ev), o_(o) {}

  void value(const Value& v, int level) {
    if (level > static_cast<int>(kMaxValueDepth) + 8) fail_budget("value nesting too deep for tojson");
    ev_.charge_steps(1);
    switch (v.kind()) {
      case Kind::none: put("null"); return;
      case Kind::boolean: put(v.as_bool() ? "true" : "false"); return;
      case Kind::integer: put(std::to_string(v.as_int())); return;
      case Kind::floating: put(float_text(v.as_double())); return;
      case Kind::string: string(v.str()); return;
      case Kind::list:
        if (v.seq() == Seq::iterator) break;
        array(v.list().items, level);
        return;
      case Kind::dict: object(v.dict(), level);  return;
      default: break;
    }
    fail(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
  }

  std::string take() { return std::move(out_); }

 private:
  static std::string float_text(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
    return py::float_repr(d);
  }

  void put(std::string_view s) {
    ev_.check_string_size(out_.size() + s.size());
    out_.append(s);
  }

  void newline(int level) {
    if (!o_.pretty) return;
    std::string nl = "\n";
    for (int i = 0; i < level; ++i) nl += o_.indent;
    put(nl);
  }

  void string(std::string_view s) {
    std::string buf;
    buf.reserve(s.size() + 2);
    buf.push_back('"');
    char tmp[16];
    size_t i = 0;
    while (i < s.size()) {
      unsigned char c = static_cast<unsigned char>(s[i]);
      if (c >= 0x80) {
        size_t start = i;
        uint32_t cp = unicode::decode_utf8(s, i);
        if (o_.ensure_ascii) {
          if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            std::snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(tmp, sizeof tmp, "\\u%04x", cp);
          }
          buf += tmp;
        } else {
          buf.append(s.substr(start, i - start));
        }
        continue;
      }
      ++i;
      switch (c) {
        case '"': buf += "\\\""; break;
        case '\\': buf += "\\\\"; break;
        case '\n': buf += "\\n"; break;
        case '\r': buf += "\\r"; break;
        case '\t': buf += "\\t"; break;
        case '\b': buf += "\\b"; break;
        case '\f': buf += "\\f"; break;
        default:
          if (c < 0x20 || (o_.ensure_ascii && c == 0x7F)) {
            std::snprintf(tmp, sizeof tmp, "\\u%04x", c);
            buf += tmp;
          } else {
            buf.push_back(static_cast<char>(c));
          }
      }
    }
    buf.push_back('"');
    put(buf);
  }

  void array(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      put("[]");
      return;
    }
    put("[");
    newline(level + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) {
        put(o_.item_sep);
        newline(level + 1);
      }
      value(items[i], level + 1);
    }
    newline(level);
    put("]");
  }

  std::string key_text(const Value& k) {
    switch (k.kind()) {
      case Kind::string: return k.str();
      case Kind::boolean: return k.as_bool() ? "true" : "false";
      case Kind::none: return "null";
      case Kind::integer: return std::to_string(k.as_int());
      case Kind::floating: return float_text(k.as_double());
      default: fail(std::string("keys must be str, int, float, bool or None, not ") + type_name(k));
    }
  }

  void object(const DictData& d, int level) {
    if (d.items.empty()) {
      put("{}");
      return;
    }
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& kv : d.items) items.push_back(&kv);
    if (o_.sort_keys) {
      std::stable_sort(items.begin(), items.end(), [](auto* p, auto* q) { return less(p->first, q->first); });
    }
    put("{");
    newline(level + 1);
    bool first = true;
    for (const auto* kv : items) {
      if (!first) {
        put(o_.item_sep);
        newline(level + 1);
      }
      first = false;
      string(key_text(kv->first));
      put(o_.key_sep);
      value(kv->second, level + 1);
    }
    newline(level);
    put("}");
  }

  Evaluator& ev_;
  const JsonDumpOptions& o_;
  std::string out_;
};

}  // namespace

std::string json_dumps(Evaluator& ev, const Value& v, const JsonDumpOptions& opts) {
  JsonWriter w(ev, opts);
  w.value(v, 0);
  return w.take();
}

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters) {
    if (name == f.name) return f.fn;
  }
  return nullptr;
}

}  // namespace serval::chat_template
