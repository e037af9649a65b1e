#include "tokenizer/chat_template/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tokenizer/chat_template/py_string.h"

namespace serval::chat_template {

void fail(std::string message) { throw TemplateError{StatusCode::invalid_argument, std::move(message), 0}; }
void fail_budget(std::string message) { throw TemplateError{StatusCode::resource_exhausted, std::move(message), 0}; }

namespace {

const std::string& empty_string() {
  static const std::string e;
  return e;
}

void check_depth(uint32_t depth) {
  if (depth > kMaxValueDepth) {
    fail_budget("value nesting deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
}

}  // namespace

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.p_ = std::make_shared<StringData>(std::move(hint));
  return v;
}

Value Value::boolean(bool b) {
  Value v = make_scalar(Kind::boolean);
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v = make_scalar(Kind::integer);
  v.i_ = i;
  return v;
}

Value Value::floating(double f) {
  Value v = make_scalar(Kind::floating);
  v.f_ = f;
  return v;
}

Value Value::string(std::string s, bool safe) {
  Value v = make_scalar(Kind::string);
  v.safe_ = safe;
  v.p_ = std::make_shared<StringData>(std::move(s));
  return v;
}

Value Value::list(std::vector<Value> items, Seq seq) {
  auto d = std::make_shared<ListData>();
  uint32_t depth = 0;
  for (const Value& it : items) depth = std::max(depth, it.depth());
  d->depth = depth + 1;
  check_depth(d->depth);
  d->items = std::move(items);
  d->seq = seq;
  Value v = make_scalar(Kind::list);
  v.p_ = std::move(d);
  return v;
}

Value Value::dict(std::shared_ptr<DictData> d) {
  uint32_t depth = 0;
  for (const auto& [k, val] : d->items) depth = std::max(depth, val.depth());
  d->depth = depth + 1;
  check_depth(d->depth);
  Value v = make_scalar(Kind::dict);
  v.p_ = std::move(d);
  return v;
}

Value Value::function(std::shared_ptr<FunctionData> f) {
  Value v = make_scalar(Kind::function);
  v.p_ = std::move(f);
  return v;
}

Value Value::object(std::shared_ptr<ObjectData> o) {
  Value v = make_scalar(Kind::object);
  v.p_ = std::move(o);
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::floating: return f_;
    case Kind::integer: return static_cast<double>(i_);
    case Kind::boolean: return b_ ? 1.0 : 0.0;
    default: return 0.0;
  }
}

const std::string& Value::str() const {
  if (!p_ || (kind_ != Kind::string && kind_ != Kind::undefined)) return empty_string();
  return static_cast<const StringData*>(p_.get())->s;
}

const ListData& Value::list() const { return *static_cast<const ListData*>(p_.get()); }
Seq Value::seq() const { return list().seq; }
const DictData& Value::dict() const { return *static_cast<const DictData*>(p_.get()); }
const FunctionData& Value::function() const { return *static_cast<const FunctionData*>(p_.get()); }
ObjectData& Value::object() const { return *static_cast<ObjectData*>(p_.get()); }

uint32_t Value::depth() const {
  switch (kind_) {
    case Kind::list: return list().depth;
    case Kind::dict: return dict().depth;
    case Kind::function: return function().depth;
    case Kind::object: return object().depth();
    default: return 0;
  }
}

Value ObjectData::call(Evaluator&, const Value&, CallArgs&) {
  fail(std::string("'") + type_name() + "' object is not callable");
}

// --- DictData ---------------------------------------------------------------

const Value* DictData::find(std::string_view key) const {
  if (!str_index_.empty()) {
    auto it = str_index_.find(std::string(key));
    return it == str_index_.end() ? nullptr : &items[it->second].second;
  }
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  if (key.is_list() && key.seq() != Seq::tuple) fail(std::string("unhashable type: '") + type_name(key) + "'");
  if (key.is_dict()) fail("unhashable type: 'dict'");
  for (const auto& [k, v] : items) {
    if (!k.is_string() && equals(k, key)) return &v;
  }
  return nullptr;
}

void DictData::set(Value key, Value value) {
  if (key.is_string()) {
    if (!str_index_.empty()) {
      auto it = str_index_.find(key.str());
      if (it != str_index_.end()) {
        items[it->second].second = std::move(value);
        return;
      }
    } else {
      for (auto& [k, v] : items) {
        if (k.is_string() && k.str() == key.str()) {
          v = std::move(value);
          return;
        }
      }
    }
    if (!str_index_.empty()) str_index_.emplace(key.str(), items.size());
    items.emplace_back(std::move(key), std::move(value));
    if (str_index_.empty() && items.size() >= 8) {
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].first.is_string()) str_index_.emplace(items[i].first.str(), i);
      }
    }
    return;
  }
  if (key.is_list() && key.seq() != Seq::tuple) fail(std::string("unhashable type: '") + type_name(key) + "'");
  if (key.is_dict()) fail("unhashable type: 'dict'");
  for (auto& [k, v] : items) {
    if (!k.is_string() && equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

// --- Python semantics -------------------------------------------------------

const char* type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return v.safe() ? "Markup" : "str";
    case Kind::list:
      switch (v.seq()) {
        case Seq::list: return "list";
        case Seq::tuple: return "tuple";
        case Seq::iterator: return "generator";
      }
      return "list";
    case Kind::dict: return "dict";
    case Kind::function: return "function";
    case Kind::object: return v.object().type_name();
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return v.as_bool();
    case Kind::integer: return v.as_int() != 0;
    case Kind::floating: return v.as_double() != 0.0;
    case Kind::string: return !v.str().empty();
    case Kind::list: return v.seq() == Seq::iterator || !v.list().items.empty();
    case Kind::dict: return !v.dict().items.empty();
    case Kind::function:
    case Kind::object: return true;
  }
  return false;
}

namespace {

// Printing recurses through namespace objects too (they call repr() on their
// attributes), so the depth is tracked per thread across those calls.
thread_local int t_print_depth = 0;
thread_local std::vector<const void*> t_repr_active;

struct PrintDepth {
  PrintDepth() {
    if (++t_print_depth > 2 * static_cast<int>(kMaxValueDepth)) {
      --t_print_depth;
      fail_budget("value nesting too deep to print");
    }
  }
  ~PrintDepth() { --t_print_depth; }
};

void repr_into(std::string& out, const Value& v, int depth);

void str_into(std::string& out, const Value& v, int depth) {
  PrintDepth guard;
  switch (v.kind()) {
    case Kind::undefined: return;
    case Kind::none: out += "None"; return;
    case Kind::boolean: out += v.as_bool() ? "True" : "False"; return;
    case Kind::integer: out += std::to_string(v.as_int()); return;
    case Kind::floating: out += py::float_repr(v.as_double()); return;
    case Kind::string: out += v.str(); return;
    case Kind::list: {
      const ListData& l = v.list();
      if (l.seq == Seq::iterator) {
        out += "<generator object>";
        return;
      }
      out += l.seq == Seq::tuple ? '(' : '[';
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        repr_into(out, l.items[i], depth + 1);
      }
      if (l.seq == Seq::tuple && l.items.size() == 1) out += ',';
      out += l.seq == Seq::tuple ? ')' : ']';
      return;
    }
    case Kind::dict: {
      out += '{';
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, k, depth + 1);
        out += ": ";
        repr_into(out, val, depth + 1);
      }
      out += '}';
      return;
    }
    case Kind::function: {
      const FunctionData& f = v.function();
      if (f.macro) {
        out += "<Macro '" + f.name + "'>";
      } else {
        out += "<built-in function " + f.name + ">";
      }
      return;
    }
    case Kind::object: out += v.object().repr(); return;
  }
}

void repr_into(std::string& out, const Value& v, int depth) {
  if (v.is_string()) {
    if (v.safe()) {
      out += "Markup(" + py::repr_string(v.str()) + ")";
    } else {
      out += py::repr_string(v.str());
    }
    return;
  }
  if (v.is_undefined()) {
    out += "Undefined";  // repr(); str() of an undefined is ""
    return;
  }
  str_into(out, v, depth);
}

}  // namespace

ReprGuard::ReprGuard(const void* obj) {
  recursive_ = std::find(t_repr_active.begin(), t_repr_active.end(), obj) != t_repr_active.end();
  if (!recursive_) t_repr_active.push_back(obj);
}

ReprGuard::~ReprGuard() {
  if (!recursive_) t_repr_active.pop_back();
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  str_into(out, v, 0);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

namespace {

bool equals_d(const Value& a, const Value& b, int depth) {
  if (depth > static_cast<int>(kMaxValueDepth) + 8) fail_budget("value nesting too deep to compare");
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::undefined:
    case Kind::none: return true;
    case Kind::string: return a.str() == b.str();
    case Kind::list: {
      if (a.heap() == b.heap()) return true;
      if (a.seq() != b.seq() || a.seq() == Seq::iterator) return false;
      const auto& x = a.list().items;
      const auto& y = b.list().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals_d(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Kind::dict: {
      if (a.heap() == b.heap()) return true;
      const DictData& x = a.dict();
      const DictData& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* o = y.find(k);
        if (!o || !equals_d(v, *o, depth + 1)) return false;
      }
      return true;
    }
    default: return a.heap() == b.heap();
  }
}

}  // namespace

bool equals(const Value& a, const Value& b) { return equals_d(a, b, 0); }

bool less(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list() && a.seq() == b.seq() && a.seq() != Seq::iterator) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less(x[i], y[i], op);
    }
    return x.size() < y.size();
  }
  fail(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) +
       "'");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined: return {};
    case Kind::list: return v.list().items;
    case Kind::dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().items.size());
      for (const auto& kv : v.dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::string: {
      std::vector<Value> chars;
      const std::string& s = v.str();
      if (py::is_ascii(s)) {
        chars.reserve(s.size());
        for (char c : s) chars.push_back(Value::string(std::string(1, c), v.safe()));
      } else {
        for (uint32_t cp : py::to_cps(s)) {
          std::string one;
          py::append_cp(one, cp);
          chars.push_back(Value::string(std::move(one), v.safe()));
        }
      }
      return chars;
    }
    default: fail(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined: return 0;
    case Kind::string: return static_cast<int64_t>(py::cp_count(v.str()));
    case Kind::list:
      if (v.seq() != Seq::iterator) return static_cast<int64_t>(v.list().items.size());
      break;
    case Kind::dict: return static_cast<int64_t>(v.dict().items.size());
    default: break;
  }
  fail(std::string("object of type '") + type_name(v) + "' has no len()");
}

void fail_undefined(const Value& v) {
  const std::string& hint = v.str();
  fail(hint.empty() ? std::string("undefined value") : hint);
}

std::string hash_key(const Value& v) {
  auto tagged = [](char tag, const std::string& body) {
    std::string k(1, tag);
    k += body;
    return k;
  };
  switch (v.kind()) {
    case Kind::undefined: return "U";
    case Kind::none: return "N";
    case Kind::boolean:
    case Kind::integer: return tagged('i', std::to_string(v.as_int()));
    case Kind::floating: {
      double d = v.as_double();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
        return tagged('i', std::to_string(static_cast<int64_t>(d)));
      }
      return tagged('f', py::float_repr(d));
    }
    case Kind::string: return tagged('s', v.str());
    case Kind::list:
      if (v.seq() == Seq::tuple) {
        std::string k = "t(";
        for (const Value& it : v.list().items) {
          std::string h = hash_key(it);
          k += std::to_string(h.size()) + ":" + h;
        }
        return k + ")";
      }
      if (v.seq() == Seq::iterator) break;
      fail("unhashable type: 'list'");
    case Kind::dict: fail("unhashable type: 'dict'");
    default: break;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "p%p", static_cast<const void*>(v.heap().get()));
  return buf;
}

}  // namespace serval::chat_template
