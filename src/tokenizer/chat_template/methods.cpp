// jinja2's builtin tests and globals, the str/dict/list methods the sandbox
// allows, and Python's printf-style (`%`) and str.format formatting.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>

#include "tokenizer/chat_template/builtins.h"
#include "tokenizer/chat_template/evaluator.h"
#include "tokenizer/chat_template/objects.h"
#include "tokenizer/chat_template/py_string.h"

namespace serval::chat_template {

namespace {

Value bound(const char* name, BuiltinFn fn, const Value& self) {
  auto f = std::make_shared<FunctionData>();
  f->name = name;
  f->builtin = fn;
  f->depth = self.depth() + 1;
  f->self = self;
  return Value::function(std::move(f));
}

std::optional<std::string> opt_str(const std::optional<Value>& v, const char* what) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) fail(std::string(what) + " must be None or str, not " + type_name(*v));
  return v->str();
}

int64_t opt_int(const std::optional<Value>& v, int64_t dflt) {
  if (!v || v->is_none()) return dflt;
  if (v->is_int() || v->is_bool()) return v->as_int();
  fail(std::string("'") + type_name(*v) + "' object cannot be interpreted as an integer");
}

const std::string& self_str(const Value& self) { return self.str(); }

// --- str methods ---------------------------------------------------------------------

template <py::StripSide side>
Value m_strip(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("strip", a, {"chars"}, x);
  return ev.make_string(py::strip(self_str(self), opt_str(x[0], "strip arg"), side), self.safe());
}

// Markup's split family returns Markup pieces.
Value list_of_strings(Evaluator& ev, const std::vector<std::string>& parts, bool safe = false) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (const std::string& p : parts) out.push_back(ev.make_string(p, safe));
  return ev.make_list(std::move(out));
}

template <bool reverse>
Value m_split(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args(reverse ? "rsplit" : "split", a, {"sep", "maxsplit"}, x);
  auto sep = opt_str(x[0], "sep");
  if (sep && sep->empty()) fail("empty separator");
  int64_t maxsplit = opt_int(x[1], -1);
  auto parts = reverse ? py::rsplit(self_str(self), sep, maxsplit) : py::split(self_str(self), sep, maxsplit);
  return list_of_strings(ev, parts, self.safe());
}

Value m_splitlines(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("splitlines", a, {"keepends"}, x);
  return list_of_strings(ev, py::splitlines(self_str(self), x[0] && truthy(*x[0])), self.safe());
}

template <bool ends>
Value m_startswith(Evaluator&, const Value& self, CallArgs& a) {
  std::optional<Value> x[3];
  bind_args(ends ? "endswith" : "startswith", a, {"prefix", "start", "end"}, x);
  if (!x[0]) fail("startswith() takes at least 1 argument (0 given)");
  std::string s = self_str(self);
  if ((x[1] && !x[1]->is_none()) || (x[2] && !x[2]->is_none())) {
    std::optional<int64_t> b, e;
    if (x[1] && !x[1]->is_none()) b = opt_int(x[1], 0);
    if (x[2] && !x[2]->is_none()) e = opt_int(x[2], 0);
    s = py::slice(s, b, e, 1);
  }
  std::vector<Value> cands;
  if (x[0]->is_string()) {
    cands.push_back(*x[0]);
  } else if (x[0]->is_list() && x[0]->seq() == Seq::tuple) {
    cands = x[0]->list().items;
  } else {
    fail(std::string(ends ? "endswith" : "startswith") + " first arg must be str or a tuple of str, not " +
         type_name(*x[0]));
  }
  for (const Value& c : cands) {
    if (!c.is_string()) fail("tuple for startswith must only contain str");
    const std::string& p = c.str();
    if (p.size() > s.size()) continue;
    if (ends ? s.compare(s.size() - p.size(), p.size(), p) == 0 : s.compare(0, p.size(), p) == 0) {
      return Value::boolean(true);
    }
  }
  return Value::boolean(false);
}

template <std::string (*F)(std::string_view)>
Value m_case(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("case", a, {}, x);
  return ev.make_string(F(self_str(self)), self.safe());
}

std::string swapcase(std::string_view s) {
  std::string out;
  for (uint32_t cp : py::to_cps(s)) {
    if (py::is_upper_cp(cp)) {
      py::append_cp(out, py::to_lower(cp));
    } else if (py::is_lower_cp(cp)) {
      py::append_cp(out, py::to_upper(cp));
    } else {
      py::append_cp(out, cp);
    }
  }
  return out;
}

Value m_replace(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[3];
  bind_args("replace", a, {"old", "new", "count"}, x);
  if (!x[0] || !x[1] || !x[0]->is_string() || !x[1]->is_string()) fail("replace() arguments must be str");
  const std::string& s = self_str(self);
  const std::string& o = x[0]->str();
  const std::string& n = x[1]->str();
  int64_t count = opt_int(x[2], -1);
  int64_t hits = o.empty() ? static_cast<int64_t>(py::cp_count(s)) + 1 : py::count(s, o);
  if (count >= 0) hits = std::min(hits, count);
  if (n.size() > o.size()) ev.check_string_size(s.size() + static_cast<size_t>(hits) * (n.size() - o.size()));
  return ev.make_string(py::replace(s, o, n, count));
}

std::string sub_arg(const std::optional<Value>& v, const char* fname) {
  if (!v || !v->is_string()) fail(std::string(fname) + "() argument must be str");
  return v->str();
}

// find/rfind/index/rindex/count with optional start/end (code points).
template <int kind>  // 0 find, 1 rfind, 2 index, 3 rindex, 4 count
Value m_find(Evaluator&, const Value& self, CallArgs& a) {
  static const char* const names[] = {"find", "rfind", "index", "rindex", "count"};
  std::optional<Value> x[3];
  bind_args(names[kind], a, {"sub", "start", "end"}, x);
  std::string sub = sub_arg(x[0], names[kind]);
  std::string s = self_str(self);
  int64_t offset = 0;
  if ((x[1] && !x[1]->is_none()) || (x[2] && !x[2]->is_none())) {
    std::optional<int64_t> b, e;
    if (x[1] && !x[1]->is_none()) b = opt_int(x[1], 0);
    if (x[2] && !x[2]->is_none()) e = opt_int(x[2], 0);
    int64_t n = static_cast<int64_t>(py::cp_count(s));
    py::SliceRange r = py::slice_range(n, b, e, 1);
    offset = r.start;
    s = py::slice(s, b, e, 1);
  }
  if (kind == 4) return Value::integer(py::count(s, sub));
  int64_t i = py::find(s, sub, kind == 1 || kind == 3);
  if (i < 0) {
    if (kind >= 2) fail("substring not found");
    return Value::integer(-1);
  }
  return Value::integer(i + offset);
}

Value m_join(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("join", a, {"iterable"}, x);
  if (!x[0]) fail("join() takes exactly one argument (0 given)");
  if (!(x[0]->is_list() || x[0]->is_dict() || x[0]->is_string() || x[0]->is_undefined())) {
    fail("can only join an iterable");
  }
  std::string out;
  size_t i = 0;
  for (const Value& item : ev.iter(*x[0])) {
    if (!item.is_string() && !self.safe()) {
      fail("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) + " found");
    }
    if (i) out += self_str(self);
    if (self.safe() && !(item.is_string() && item.safe())) {
      out += py::html_escape(to_str(item));  // Markup.join escapes the items
    } else {
      out += item.str();
    }
    ev.check_string_size(out.size());
    ++i;
  }
  return ev.make_string(std::move(out), self.safe());
}

template <bool (*Pred)(uint32_t)>
Value m_is(Evaluator&, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("is", a, {}, x);
  auto cps = py::to_cps(self_str(self));
  if (cps.empty()) return Value::boolean(false);
  return Value::boolean(std::all_of(cps.begin(), cps.end(), Pred));
}

Value m_islower(Evaluator&, const Value& self, CallArgs&) { return Value::boolean(py::islower(self_str(self))); }
Value m_isupper(Evaluator&, const Value& self, CallArgs&) { return Value::boolean(py::isupper(self_str(self))); }

template <int kind>  // 0 center, 1 ljust, 2 rjust
Value m_pad(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args(kind == 0 ? "center" : kind == 1 ? "ljust" : "rjust", a, {"width", "fillchar"}, x);
  int64_t width = opt_int(x[0], 0);
  std::string fill = " ";
  if (x[1]) {
    if (!x[1]->is_string() || py::cp_count(x[1]->str()) != 1) {
      fail("The fill character must be exactly one character long");
    }
    fill = x[1]->str();
  }
  const std::string& s = self_str(self);
  int64_t n = static_cast<int64_t>(py::cp_count(s));
  if (width <= n) return self;
  ev.check_string_size(static_cast<size_t>(std::min<int64_t>(width, INT32_MAX)) * fill.size());
  int64_t marg = width - n;
  int64_t left = kind == 0 ? marg / 2 + (marg & width & 1) : kind == 1 ? 0 : marg;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return ev.make_string(std::move(out));
}

Value m_zfill(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("zfill", a, {"width"}, x);
  int64_t width = opt_int(x[0], 0);
  std::string s = self_str(self);
  int64_t n = static_cast<int64_t>(py::cp_count(s));
  if (width <= n) return self;
  ev.check_string_size(static_cast<size_t>(std::min<int64_t>(width, INT32_MAX)));
  std::string pad(static_cast<size_t>(width - n), '0');
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) return ev.make_string(s.substr(0, 1) + pad + s.substr(1));
  return ev.make_string(pad + s);
}

template <bool reverse>
Value m_partition(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args(reverse ? "rpartition" : "partition", a, {"sep"}, x);
  std::string sep = sub_arg(x[0], "partition");
  if (sep.empty()) fail("empty separator");
  const std::string& s = self_str(self);
  size_t f = reverse ? s.rfind(sep) : s.find(sep);
  std::vector<Value> out;
  if (f == std::string::npos) {
    if (reverse) {
      out = {ev.make_string(""), ev.make_string(""), ev.make_string(s)};
    } else {
      out = {ev.make_string(s), ev.make_string(""), ev.make_string("")};
    }
  } else {
    out = {ev.make_string(s.substr(0, f)), ev.make_string(sep), ev.make_string(s.substr(f + sep.size()))};
  }
  if (self.safe()) {
    for (Value& p : out) p = ev.make_string(p.str(), true);
  }
  return ev.make_list(std::move(out), Seq::tuple);
}

template <bool suffix>
Value m_remove_affix(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args(suffix ? "removesuffix" : "removeprefix", a, {"affix"}, x);
  std::string p = sub_arg(x[0], suffix ? "removesuffix" : "removeprefix");
  const std::string& s = self_str(self);
  if (!p.empty() && p.size() <= s.size()) {
    if (!suffix && s.compare(0, p.size(), p) == 0) return ev.make_string(s.substr(p.size()));
    if (suffix && s.compare(s.size() - p.size(), p.size(), p) == 0) return ev.make_string(s.substr(0, s.size() - p.size()));
  }
  return self;
}

Value m_format(Evaluator& ev, const Value& self, CallArgs& a);

struct MethodEntry {
  const char* name;
  BuiltinFn fn;
};

bool is_decimal(uint32_t cp) { return py::is_digit(cp); }

const MethodEntry kStrMethods[] = {
    {"strip", m_strip<py::StripSide::both>},
    {"lstrip", m_strip<py::StripSide::left>},
    {"rstrip", m_strip<py::StripSide::right>},
    {"split", m_split<false>},
    {"rsplit", m_split<true>},
    {"splitlines", m_splitlines},
    {"startswith", m_startswith<false>},
    {"endswith", m_startswith<true>},
    {"upper", m_case<py::upper>},
    {"lower", m_case<py::lower>},
    {"casefold", m_case<py::lower>},
    {"title", m_case<py::title>},
    {"capitalize", m_case<py::capitalize>},
    {"swapcase", m_case<swapcase>},
    {"replace", m_replace},
    {"find", m_find<0>},
    {"rfind", m_find<1>},
    {"index", m_find<2>},
    {"rindex", m_find<3>},
    {"count", m_find<4>},
    {"join", m_join},
    {"format", m_format},
    {"isdigit", m_is<is_decimal>},
    {"isdecimal", m_is<is_decimal>},
    {"isnumeric", m_is<is_decimal>},
    {"isalpha", m_is<py::is_alpha>},
    {"isalnum", m_is<py::is_alnum>},
    {"isspace", m_is<py::is_space>},
    {"islower", m_islower},
    {"isupper", m_isupper},
    {"center", m_pad<0>},
    {"ljust", m_pad<1>},
    {"rjust", m_pad<2>},
    {"zfill", m_zfill},
    {"partition", m_partition<false>},
    {"rpartition", m_partition<true>},
    {"removeprefix", m_remove_affix<false>},
    {"removesuffix", m_remove_affix<true>},
};

// --- dict methods ------------------------------------------------------------------------

Value m_get(Evaluator&, const Value& self, CallArgs& a) {
  std::optional<Value> x[2];
  bind_args("get", a, {"key", "default"}, x);
  if (!x[0]) fail("get expected at least 1 argument, got 0");
  if (const Value* v = self.dict().find(*x[0])) return *v;
  return x[1] ? *x[1] : Value::none();
}

Value m_items(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("items", a, {}, x);
  std::vector<Value> out;
  for (const auto& [k, v] : self.dict().items) out.push_back(ev.make_list({k, v}, Seq::tuple));
  return ev.make_list(std::move(out));
}

Value m_keys(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("keys", a, {}, x);
  std::vector<Value> out;
  for (const auto& kv : self.dict().items) out.push_back(kv.first);
  return ev.make_list(std::move(out));
}

Value m_values(Evaluator& ev, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("values", a, {}, x);
  std::vector<Value> out;
  for (const auto& kv : self.dict().items) out.push_back(kv.second);
  return ev.make_list(std::move(out));
}

Value m_copy(Evaluator&, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("copy", a, {}, x);
  return self;  // values are immutable: a copy is indistinguishable
}

const MethodEntry kDictMethods[] = {
    {"get", m_get}, {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"copy", m_copy},
};
const char* const kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};

// --- list methods ---------------------------------------------------------------------------

Value m_list_index(Evaluator&, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("index", a, {"value"}, x);
  if (!x[0]) fail("index expected at least 1 argument, got 0");
  const auto& items = self.list().items;
  for (size_t i = 0; i < items.size(); ++i) {
    if (equals(items[i], *x[0])) return Value::integer(static_cast<int64_t>(i));
  }
  fail(repr(*x[0]) + " is not in list");
}

Value m_list_count(Evaluator&, const Value& self, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("count", a, {"value"}, x);
  if (!x[0]) fail("count() takes exactly one argument (0 given)");
  int64_t n = 0;
  for (const Value& v : self.list().items) n += equals(v, *x[0]) ? 1 : 0;
  return Value::integer(n);
}

const MethodEntry kListMethods[] = {{"index", m_list_index}, {"count", m_list_count}, {"copy", m_copy}};
const char* const kListMutators[] = {"append", "reverse", "insert", "sort", "extend", "remove", "pop", "clear"};

// --- tests -------------------------------------------------------------------------------------

bool t_odd_even(const Value& v, bool odd) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int() || v.is_bool()) {
    int64_t m = v.as_int() % 2;
    if (m < 0) m += 2;
    return odd ? m == 1 : m == 0;
  }
  if (v.is_float()) {
    double m = std::fmod(v.as_double(), 2.0);
    if (m < 0) m += 2.0;
    return odd ? m == 1.0 : m == 0.0;
  }
  fail(std::string("unsupported operand type(s) for %: '") + type_name(v) + "' and 'int'");
}

std::optional<Value> one_arg(const char* name, CallArgs& a, const char* argname) {
  std::optional<Value> x[1];
  bind_args(name, a, {argname}, x);
  return x[0];
}

bool t_odd(Evaluator&, const Value& v, CallArgs& a) {
  one_arg("odd", a, "_");
  return t_odd_even(v, true);
}
bool t_even(Evaluator&, const Value& v, CallArgs& a) {
  one_arg("even", a, "_");
  return t_odd_even(v, false);
}
bool t_divisibleby(Evaluator&, const Value& v, CallArgs& a) {
  auto n = one_arg("divisibleby", a, "num");
  if (!n) fail("divisibleby() missing required argument 'num'");
  if (v.is_undefined()) fail_undefined(v);
  if ((v.is_int() || v.is_bool()) && (n->is_int() || n->is_bool())) {
    if (n->as_int() == 0) fail("integer division or modulo by zero");
    return v.as_int() % n->as_int() == 0;
  }
  if (v.is_number() && n->is_number()) {
    if (n->as_double() == 0) fail("float modulo");
    return std::fmod(v.as_double(), n->as_double()) == 0;
  }
  fail("unsupported operand type(s) for %");
}
bool t_defined(Evaluator&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Evaluator&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_filter(Evaluator&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.str()) != nullptr; }
bool t_test(Evaluator&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.str()) != nullptr; }
bool t_none(Evaluator&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Evaluator&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_false(Evaluator&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_true(Evaluator&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_integer(Evaluator&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Evaluator&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_lower(Evaluator&, const Value& v, CallArgs&) { return py::islower(to_str(v)); }
bool t_upper(Evaluator&, const Value& v, CallArgs&) { return py::isupper(to_str(v)); }
bool t_string(Evaluator&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Evaluator&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_number(Evaluator&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_sequence(Evaluator&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_dict() || v.is_undefined() || (v.is_list() && v.seq() != Seq::iterator);
}
bool t_iterable(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_string() || v.is_list() || v.is_dict() || v.is_undefined()) return true;
  return v.is_object() && dynamic_cast<const LoopObj*>(&v.object()) != nullptr;
}
bool t_callable(Evaluator&, const Value& v, CallArgs&) {
  return v.is_function() || v.is_undefined() || (v.is_object() && v.object().callable());
}
bool t_sameas(Evaluator&, const Value& v, CallArgs& a) {
  auto o = one_arg("sameas", a, "other");
  if (!o) fail("sameas() missing required argument 'other'");
  if (v.kind() != o->kind()) return false;
  switch (v.kind()) {
    case Kind::none:
    case Kind::undefined: return v.is_none() || v.heap() == o->heap();
    case Kind::boolean: return v.as_bool() == o->as_bool();
    case Kind::integer: return v.as_int() == o->as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    default: return v.heap() == o->heap();
  }
}
bool t_escaped(Evaluator&, const Value& v, CallArgs&) { return v.is_string() && v.safe(); }
bool t_in(Evaluator&, const Value& v, CallArgs& a) {
  auto seq = one_arg("in", a, "seq");
  if (!seq) fail("in() missing required argument 'seq'");
  return value_contains(*seq, v);
}

template <int op>  // 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge
bool t_cmp(Evaluator&, const Value& v, CallArgs& a) {
  auto o = one_arg("compare", a, "other");
  if (!o) fail("comparison test requires an argument");
  switch (op) {
    case 0: return equals(v, *o);
    case 1: return !equals(v, *o);
    case 2: return less(v, *o, "<");
    case 3: return less(v, *o, "<=") || equals(v, *o);
    case 4: return less(*o, v, ">");
    default: return less(*o, v, ">=") || equals(v, *o);
  }
}

struct TestEntry {
  const char* name;
  TestFn fn;
};

const TestEntry kTests[] = {
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"filter", t_filter},
    {"test", t_test},
    {"none", t_none},
    {"boolean", t_boolean},
    {"false", t_false},
    {"true", t_true},
    {"integer", t_integer},
    {"float", t_float},
    {"lower", t_lower},
    {"upper", t_upper},
    {"string", t_string},
    {"mapping", t_mapping},
    {"number", t_number},
    {"sequence", t_sequence},
    {"iterable", t_iterable},
    {"callable", t_callable},
    {"sameas", t_sameas},
    {"escaped", t_escaped},
    {"in", t_in},
    {"==", t_cmp<0>},
    {"eq", t_cmp<0>},
    {"equalto", t_cmp<0>},
    {"!=", t_cmp<1>},
    {"ne", t_cmp<1>},
    {"<", t_cmp<2>},
    {"lt", t_cmp<2>},
    {"lessthan", t_cmp<2>},
    {"<=", t_cmp<3>},
    {"le", t_cmp<3>},
    {">", t_cmp<4>},
    {"gt", t_cmp<4>},
    {"greaterthan", t_cmp<4>},
    {">=", t_cmp<5>},
    {"ge", t_cmp<5>},
};

// --- globals --------------------------------------------------------------------------------------

Value g_range(Evaluator& ev, const Value&, CallArgs& a) {
  if (!a.kw.empty()) fail("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) fail("range expected 1 to 3 arguments");
  int64_t v[3] = {0, 0, 0};
  for (size_t i = 0; i < a.pos.size(); ++i) {
    const Value& x = a.pos[i];
    if (x.is_undefined()) fail_undefined(x);
    if (!(x.is_int() || x.is_bool())) {
      fail(std::string("'") + type_name(x) + "' object cannot be interpreted as an integer");
    }
    v[i] = x.as_int();
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = v[0];
  } else {
    start = v[0];
    stop = v[1];
    if (a.pos.size() == 3) step = v[2];
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  __int128 count = 0;
  if (step > 0 && start < stop) count = ((__int128)stop - start - 1) / step + 1;
  if (step < 0 && start > stop) count = ((__int128)start - stop - 1) / (-(__int128)step) + 1;
  if (count > 100000) {
    fail_budget("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.push_back(Value::integer(start + i * step));
  return ev.make_list(std::move(out));
}

void dict_update(Evaluator& ev, DictData& d, CallArgs& a, const char* fname) {
  if (a.pos.size() > 1) fail(std::string(fname) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  if (a.pos.size() == 1) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict().items) d.set(k, v);
    } else if (src.is_list() || src.is_undefined()) {
      size_t i = 0;
      for (const Value& pair : ev.iter(src)) {
        if (!pair.is_list() || pair.seq() == Seq::iterator || pair.list().items.size() != 2) {
          fail("dictionary update sequence element #" + std::to_string(i) + " has wrong length");
        }
        d.set(pair.list().items[0], pair.list().items[1]);
        ++i;
      }
    } else {
      fail(std::string("'") + type_name(src) + "' object is not iterable");
    }
  }
  for (auto& [k, v] : a.kw) d.set(Value::string(k), v);
}

Value g_dict(Evaluator& ev, const Value&, CallArgs& a) {
  auto d = std::make_shared<DictData>();
  dict_update(ev, *d, a, "dict");
  return ev.make_dict(std::move(d));
}

Value g_namespace(Evaluator& ev, const Value&, CallArgs& a) {
  auto ns = std::make_shared<NamespaceObj>();
  dict_update(ev, ns->attrs, a, "namespace");
  ev.track(ns);
  return Value::object(ns);
}

Value g_raise_exception(Evaluator&, const Value&, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("raise_exception", a, {"message"}, x);
  fail("template raised an exception: " + (x[0] ? to_str(*x[0]) : std::string()));
}

Value g_strftime_now(Evaluator& ev, const Value&, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("strftime_now", a, {"format"}, x);
  if (!x[0] || !x[0]->is_string()) fail("strftime_now() argument must be str");
  const std::string& fmt = x[0]->str();
  if (fmt.size() > 4096) fail_budget("strftime_now(): format too long");
  std::time_t t = ev.options().now_unix_seconds ? static_cast<std::time_t>(*ev.options().now_unix_seconds)
                                                : std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  if (fmt.empty()) return ev.make_string("");
  std::string buf(fmt.size() * 32 + 64, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return ev.make_string(std::move(buf));
}

Value g_cycler(Evaluator& ev, const Value&, CallArgs& a) {
  if (!a.kw.empty()) fail("cycler() takes no keyword arguments");
  auto c = std::make_shared<CyclerObj>();
  c->items = a.pos;
  for (const Value& v : c->items) c->items_depth = std::max(c->items_depth, v.depth());
  ev.check_collection_size(c->items.size());
  ev.track(c);
  return Value::object(c);
}

Value g_joiner(Evaluator& ev, const Value&, CallArgs& a) {
  std::optional<Value> x[1];
  bind_args("joiner", a, {"sep"}, x);
  auto j = std::make_shared<JoinerObj>();
  j->sep = x[0] ? to_str(*x[0]) : std::string(", ");
  ev.track(j);
  return Value::object(j);
}

struct GlobalEntry {
  const char* name;
  BuiltinFn fn;
};

const GlobalEntry kGlobals[] = {
    {"range", g_range},
    {"dict", g_dict},
    {"namespace", g_namespace},
    {"raise_exception", g_raise_exception},
    {"strftime_now", g_strftime_now},
    {"cycler", g_cycler},
    {"joiner", g_joiner},
};

// --- printf-style formatting ---------------------------------------------------------------------

std::string pad_to(std::string s, int64_t width, bool left) {
  int64_t n = static_cast<int64_t>(py::cp_count(s));
  if (width <= n) return s;
  std::string pad(static_cast<size_t>(width - n), ' ');
  return left ? s + pad : pad + s;
}

}  // namespace

Value py_percent_format(Evaluator& ev, const Value& fmt_v, const Value& args) {
  const std::string& fmt = fmt_v.str();
  std::vector<Value> pos;
  const DictData* mapping = nullptr;
  if (args.is_list() && args.seq() == Seq::tuple) {
    pos = args.list().items;
  } else {
    pos.push_back(args);
    if (args.is_dict()) mapping = &args.dict();
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  auto take = [&]() -> Value {
    if (next >= pos.size()) fail("not enough arguments for format string");
    return pos[next++];
  };
  size_t i = 0;
  while (i < fmt.size()) {
    char c = fmt[i];
    if (c != '%') {
      out.push_back(c);
      ++i;
      continue;
    }
    ++i;
    if (i >= fmt.size()) fail("incomplete format");
    std::optional<Value> keyed;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      std::string key = fmt.substr(i + 1, close - i - 1);
      const Value* v = mapping->find(std::string_view(key));
      if (!v) fail("KeyError: " + py::repr_string(key));
      keyed = *v;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) flags.push_back(fmt[i++]);
    int64_t width = -1, prec = -1;
    if (i < fmt.size() && fmt[i] == '*') {
      Value w = take();
      if (!w.is_int()) fail("* wants int");
      width = w.as_int();
      ++i;
    } else {
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        width = std::max<int64_t>(width, 0) * 10 + (fmt[i++] - '0');
        if (width > 100000) fail_budget("format width too large");
      }
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      prec = 0;
      if (i < fmt.size() && fmt[i] == '*') {
        Value p = take();
        if (!p.is_int()) fail("* wants int");
        prec = p.as_int();
        ++i;
      } else {
        while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
          prec = prec * 10 + (fmt[i++] - '0');
          if (prec > 100000) fail_budget("format precision too large");
        }
      }
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) fail("incomplete format");
    char conv = fmt[i++];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    Value v = keyed ? *keyed : take();
    bool left = flags.find('-') != std::string::npos;
    std::string piece;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        piece = conv == 's' ? to_str(v) : repr(v);
        if (fmt_v.safe() && !(conv == 's' && v.is_string() && v.safe())) piece = py::html_escape(piece);
        if (prec >= 0) piece = py::slice(piece, std::nullopt, prec, 1);
        piece = pad_to(std::move(piece), width, left);
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'o':
      case 'x':
      case 'X':
      case 'c':
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (conv == 'c') {
          if (v.is_string() && py::cp_count(v.str()) == 1) {
            piece = pad_to(v.str(), width, left);
          } else if (v.is_int()) {
            std::string ch;
            py::append_cp(ch, static_cast<uint32_t>(v.as_int()));
            piece = pad_to(ch, width, left);
          } else {
            fail("%c requires int or char");
          }
          break;
        }
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number()) {
          fail(std::string("%") + conv + " format: a real number is required, not " + type_name(v));
        }
        std::string spec = "%" + flags;
        if (width >= 0) spec += std::to_string(width);
        if (prec >= 0) spec += "." + std::to_string(prec);
        char buf[512];
        bool integral = conv == 'd' || conv == 'i' || conv == 'u' || conv == 'o' || conv == 'x' || conv == 'X';
        if (integral) {
          if ((conv == 'o' || conv == 'x' || conv == 'X') && v.is_float()) {
            fail(std::string("%") + conv + " format: an integer is required, not float");
          }
          long long n = v.is_float() ? static_cast<long long>(std::trunc(v.as_double())) : v.as_int();
          spec += "ll";
          spec += (conv == 'i' || conv == 'u') ? 'd' : conv;
          std::snprintf(buf, sizeof buf, spec.c_str(), n);
          piece = buf;
          if (conv == 'o' && flags.find('#') != std::string::npos) {
            // Python writes 0o17 where C writes 017.
            size_t z = piece.find('0');
            if (z != std::string::npos) piece.insert(z + 1, "o");
          }
        } else {
          spec += conv;
          int len = std::snprintf(buf, sizeof buf, spec.c_str(), v.as_double());
          if (len < 0 || static_cast<size_t>(len) >= sizeof buf) {
            std::string big(static_cast<size_t>(std::max(len, 0)) + 1, '\0');
            std::snprintf(big.data(), big.size(), spec.c_str(), v.as_double());
            big.resize(static_cast<size_t>(std::max(len, 0)));
            piece = big;
          } else {
            piece = buf;
          }
          if (piece == "nan" || piece == "-nan" || piece == "inf" || piece == "-inf") {
            // C and Python agree except for the sign of nan.
            if (piece == "-nan") piece = "nan";
          }
        }
        break;
      }
      default: fail(std::string("unsupported format character '") + conv + "'");
    }
    out += piece;
    ev.check_string_size(out.size());
  }
  if (!used_mapping && !mapping && next < pos.size()) fail("not all arguments converted during string formatting");
  return ev.make_string(std::move(out), fmt_v.safe());
}

namespace {

// --- str.format ------------------------------------------------------------------------------------

std::string format_spec(const Value& v, const std::string& spec) {
  // [[fill]align][sign][#][0][width][,][.precision][type]
  size_t i = 0;
  std::string fill = " ";
  char align = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  std::vector<uint32_t> cps = py::to_cps(spec);
  std::string rest;
  if (cps.size() >= 2 && cps[1] < 0x80 && is_align(static_cast<char>(cps[1]))) {
    fill.clear();
    py::append_cp(fill, cps[0]);
    align = static_cast<char>(cps[1]);
    rest = py::from_cps(cps.data() + 2, cps.size() - 2);
  } else if (!cps.empty() && cps[0] < 0x80 && is_align(static_cast<char>(cps[0]))) {
    align = static_cast<char>(cps[0]);
    rest = py::from_cps(cps.data() + 1, cps.size() - 1);
  } else {
    rest = spec;
  }
  char sign = 0;
  if (i < rest.size() && (rest[i] == '+' || rest[i] == '-' || rest[i] == ' ')) sign = rest[i++];
  bool alt = false;
  if (i < rest.size() && rest[i] == '#') {
    alt = true;
    ++i;
  }
  if (i < rest.size() && rest[i] == '0') {
    if (!align) {
      fill = "0";
      align = '=';
    }
    ++i;
  }
  int64_t width = 0;
  while (i < rest.size() && std::isdigit(static_cast<unsigned char>(rest[i]))) {
    width = width * 10 + (rest[i++] - '0');
    if (width > 100000) fail_budget("format width too large");
  }
  if (i < rest.size() && (rest[i] == ',' || rest[i] == '_')) fail("thousands separators are not supported");
  int64_t prec = -1;
  if (i < rest.size() && rest[i] == '.') {
    ++i;
    prec = 0;
    while (i < rest.size() && std::isdigit(static_cast<unsigned char>(rest[i]))) {
      prec = prec * 10 + (rest[i++] - '0');
      if (prec > 1000) fail_budget("format precision too large");
    }
  }
  char type = 0;
  if (i < rest.size()) type = rest[i++];
  if (i != rest.size()) fail("Invalid format specifier");
  std::string body;
  bool numeric = false;
  if (type == 0 || type == 's') {
    if (v.is_number() && type == 0 && prec < 0 && !sign && !alt) {
      body = to_str(v);
      numeric = true;
    } else if (type == 's' || v.is_string() || !v.is_number()) {
      if (!v.is_string() && type == 's' && v.is_number()) fail("Unknown format code 's' for object of type 'int'");
      body = to_str(v);
      if (prec >= 0) body = py::slice(body, std::nullopt, prec, 1);
    } else {
      type = 'g';
    }
  }
  if (!body.size() && type != 0 && type != 's') {
    if (!v.is_number()) fail(std::string("Unknown format code '") + type + "' for object of type '" + type_name(v) + "'");
    numeric = true;
    std::string cspec = "%";
    if (sign == '+' || sign == ' ') cspec += sign;
    if (alt) cspec += '#';
    char buf[1200];
    if (type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b' || type == 'c' || type == 'n') {
      if (v.is_float()) fail(std::string("Unknown format code '") + type + "' for object of type 'float'");
      long long n = v.as_int();
      if (type == 'b') {
        unsigned long long u = n < 0 ? -static_cast<unsigned long long>(n) : static_cast<unsigned long long>(n);
        std::string bits;
        do {
          bits.insert(bits.begin(), static_cast<char>('0' + (u & 1)));
          u >>= 1;
        } while (u);
        if (alt) bits = "0b" + bits;
        body = (n < 0 ? "-" : (sign == '+' ? "+" : sign == ' ' ? " " : "")) + bits;
      } else if (type == 'c') {
        py::append_cp(body, static_cast<uint32_t>(n));
      } else {
        cspec += "ll";
        cspec += (type == 'n') ? 'd' : type;
        std::snprintf(buf, sizeof buf, cspec.c_str(), n);
        body = buf;
      }
    } else if (std::string_view("eEfFgG%").find(type) != std::string_view::npos) {
      double d = v.as_double();
      if (type == '%') {
        d *= 100;
        cspec += "." + std::to_string(prec < 0 ? 6 : prec) + "f";
      } else {
        cspec += "." + std::to_string(prec < 0 ? 6 : prec) + type;
      }
      std::snprintf(buf, sizeof buf, cspec.c_str(), d);
      body = buf;
      if (type == '%') body += "%";
    } else {
      fail(std::string("Unknown format code '") + type + "'");
    }
  } else if (numeric && sign == '+' && v.is_number() && v.as_double() >= 0) {
    body = "+" + body;
  }
  int64_t n = static_cast<int64_t>(py::cp_count(body));
  if (width <= n) return body;
  if (!align) align = numeric ? '>' : '<';
  int64_t marg = width - n;
  std::string out;
  auto rep = [&](int64_t k) {
    for (int64_t j = 0; j < k; ++j) out += fill;
  };
  switch (align) {
    case '<':
      out = body;
      rep(marg);
      break;
    case '>':
      rep(marg);
      out += body;
      break;
    case '^':
      rep(marg / 2);
      out += body;
      rep(marg - marg / 2);
      break;
    case '=': {
      size_t s = (!body.empty() && (body[0] == '+' || body[0] == '-' || body[0] == ' ')) ? 1 : 0;
      out = body.substr(0, s);
      rep(marg);
      out += body.substr(s);
      break;
    }
  }
  return out;
}

}  // namespace

namespace {

Value m_format(Evaluator& ev, const Value& self, CallArgs& a) {
  const std::string& fmt = self.str();
  std::string out;
  size_t auto_index = 0;
  size_t i = 0;
  while (i < fmt.size()) {
    char c = fmt[i];
    if (c == '{') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
        out.push_back('{');
        i += 2;
        continue;
      }
      size_t close = fmt.find('}', i);
      if (close == std::string::npos) fail("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find('{') != std::string::npos) fail("nested replacement fields are not supported");
      i = close + 1;
      std::string spec;
      char conv = 0;
      size_t colon = field.find(':');
      if (colon != std::string::npos) {
        spec = field.substr(colon + 1);
        field = field.substr(0, colon);
      }
      size_t bang = field.find('!');
      if (bang != std::string::npos) {
        if (bang + 2 != field.size()) fail("expected ':' after conversion specifier");
        conv = field[bang + 1];
        field = field.substr(0, bang);
      }
      // arg_name then .attr / [key] parts
      size_t j = 0;
      while (j < field.size() && field[j] != '.' && field[j] != '[') ++j;
      std::string name = field.substr(0, j);
      Value v;
      if (name.empty()) {
        if (auto_index >= a.pos.size()) fail("Replacement index " + std::to_string(auto_index) + " out of range");
        v = a.pos[auto_index++];
      } else if (std::all_of(name.begin(), name.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        size_t idx = static_cast<size_t>(std::stoull(name.size() > 9 ? std::string("999999999") : name));
        if (idx >= a.pos.size()) fail("Replacement index " + name + " out of range");
        v = a.pos[idx];
      } else {
        bool found = false;
        for (auto& [k, val] : a.kw) {
          if (k == name) {
            v = val;
            found = true;
            break;
          }
        }
        if (!found) fail("KeyError: " + py::repr_string(name));
      }
      while (j < field.size()) {
        if (field[j] == '.') {
          size_t e = j + 1;
          while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
          v = ev.getattr(v, field.substr(j + 1, e - j - 1));
          j = e;
        } else {
          size_t e = field.find(']', j);
          if (e == std::string::npos) fail("Missing ']' in format string");
          std::string key = field.substr(j + 1, e - j - 1);
          bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
          v = ev.getitem(v, digits && key.size() < 18 ? Value::integer(std::stoll(key)) : Value::string(key));
          j = e + 1;
        }
      }
      if (conv == 'r' || conv == 'a') {
        v = Value::string(repr(v));
      } else if (conv == 's') {
        v = Value::string(to_str(v));
      } else if (conv) {
        fail(std::string("Unknown conversion specifier ") + conv);
      }
      out += format_spec(v, spec);
      ev.check_string_size(out.size());
    } else if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      fail("Single '}' encountered in format string");
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return ev.make_string(std::move(out));
}

}  // namespace

std::optional<Value> find_method(const Value& obj, std::string_view name) {
  if (obj.is_string()) {
    for (const auto& m : kStrMethods) {
      if (name == m.name) return bound(m.name, m.fn, obj);
    }
    return std::nullopt;
  }
  if (obj.is_dict()) {
    for (const auto& m : kDictMethods) {
      if (name == m.name) return bound(m.name, m.fn, obj);
    }
    for (const char* m : kDictMutators) {
      if (name == m) return Value::undefined("access to attribute '" + std::string(name) + "' of 'dict' object is unsafe.");
    }
    return std::nullopt;
  }
  if (obj.is_list() && obj.seq() != Seq::iterator) {
    for (const auto& m : kListMethods) {
      if (name == m.name) return bound(m.name, m.fn, obj);
    }
    if (obj.seq() == Seq::list) {
      for (const char* m : kListMutators) {
        if (name == m) {
          return Value::undefined("access to attribute '" + std::string(name) + "' of 'list' object is unsafe.");
        }
      }
    }
  }
  return std::nullopt;
}

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests) {
    if (name == t.name) return t.fn;
  }
  return nullptr;
}

std::optional<Value> find_global(std::string_view name) {
  for (const auto& g : kGlobals) {
    if (name == g.name) {
      auto f = std::make_shared<FunctionData>();
      f->name = g.name;
      f->builtin = g.fn;
      return Value::function(std::move(f));
    }
  }
  return std::nullopt;
}

}  // namespace serval::chat_template
