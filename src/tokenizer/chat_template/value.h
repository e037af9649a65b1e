// The value model of the chat-template renderer: Python's data types as
// jinja2 sees them (None, bool, int, float, str/Markup, list, tuple,
// iterator, dict, functions, namespace/loop objects) and jinja2's Undefined.
//
// Values are immutable once built (the sandbox forbids mutating lists and
// dicts), except namespace objects, whose attributes `{% set ns.x %}` sets.
// Heap parts are shared (shared_ptr), so copying a Value is cheap. A Value
// lives inside one render call and is used by one thread.
//
// Errors inside the renderer are thrown as TemplateError and turned into a
// Status at the API boundary (chat_template.cpp); nothing escapes it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace serval::chat_template {

// Thrown by the renderer's internals, caught by ChatTemplate::render/compile.
struct TemplateError {
  StatusCode code = StatusCode::invalid_argument;
  std::string message;
  int line = 0;  // 0 = not yet known; the evaluator fills in the current line
};

[[noreturn]] void fail(std::string message);         // invalid_argument
[[noreturn]] void fail_budget(std::string message);  // resource_exhausted

// Nesting limit of list/dict values (built by a template or converted from
// the context). Bounds every recursion over values (repr, tojson, ==).
inline constexpr uint32_t kMaxValueDepth = 128;

enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, function, object };
// Python sequence flavours: list, tuple, and one-shot iterators (what
// jinja2's select/map/items/reverse filters return: no len(), no indexing,
// always truthy).
enum class Seq : uint8_t { list, tuple, iterator };

struct HeapObject {
  virtual ~HeapObject() = default;
};

class Value;
struct ListData;
struct DictData;
struct FunctionData;
struct ObjectData;

class Value {
 public:
  Value() = default;  // undefined

  static Value undefined(std::string hint = {});
  static Value none() { return make_scalar(Kind::none); }
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s, bool safe = false);
  static Value list(std::vector<Value> items, Seq seq = Seq::list);
  static Value dict(std::shared_ptr<DictData> d);
  static Value function(std::shared_ptr<FunctionData> f);
  static Value object(std::shared_ptr<ObjectData> o);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_int() const { return kind_ == Kind::integer; }  // not bool
  bool is_float() const { return kind_ == Kind::floating; }
  bool is_number() const { return kind_ == Kind::integer || kind_ == Kind::floating || kind_ == Kind::boolean; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_list() const { return kind_ == Kind::list; }  // any Seq
  bool is_dict() const { return kind_ == Kind::dict; }
  bool is_function() const { return kind_ == Kind::function; }
  bool is_object() const { return kind_ == Kind::object; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::boolean ? (b_ ? 1 : 0) : i_; }  // int or bool
  double as_double() const;                                                       // any number
  const std::string& str() const;     // string, or the hint of an undefined
  bool safe() const { return safe_; }  // a markupsafe.Markup string
  const ListData& list() const;
  Seq seq() const;
  const DictData& dict() const;
  const FunctionData& function() const;
  ObjectData& object() const;
  const std::shared_ptr<HeapObject>& heap() const { return p_; }

  uint32_t depth() const;  // nesting depth of list/dict values (0 for scalars)

 private:
  static Value make_scalar(Kind k) {
    Value v;
    v.kind_ = k;
    return v;
  }

  Kind kind_ = Kind::undefined;
  bool safe_ = false;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<HeapObject> p_;
};

struct StringData final : HeapObject {
  explicit StringData(std::string v) : s(std::move(v)) {}
  std::string s;
};

struct ListData final : HeapObject {
  std::vector<Value> items;
  Seq seq = Seq::list;
  bool group_tuple = false;  // groupby's (grouper, list) namedtuple
  uint32_t depth = 1;
};

// An insertion-ordered dict (Python 3.7+). Keys are any hashable scalar;
// string keys are indexed for fast lookup.
struct DictData final : HeapObject {
  std::vector<std::pair<Value, Value>> items;
  uint32_t depth = 1;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts or replaces (keeping the first position, as Python does).
  void set(Value key, Value value);

 private:
  std::unordered_map<std::string, size_t> str_index_;
};

// Arguments of a call: positional then keyword (Python order).
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Evaluator;
struct Scope;
namespace ast {
struct Stmt;
}

using BuiltinFn = Value (*)(Evaluator& ev, const Value& self, CallArgs& args);

// A callable: a builtin (a global like range(), or a bound method such as
// str.split with its receiver in `self`) or a template macro / call block.
struct FunctionData final : HeapObject {
  std::string name;
  BuiltinFn builtin = nullptr;
  Value self;
  // Macros and the `caller` of a call block:
  const ast::Stmt* macro = nullptr;  // a Macro or CallBlock statement
  Scope* closure = nullptr;          // where it was defined (owned by the Evaluator)
  Value caller;                      // the call block's caller, passed as `caller`
  uint32_t depth = 0;                // 1 + self.depth() for bound methods
};

// Objects with attributes: namespace(), the loop variable, cycler, joiner.
struct ObjectData : HeapObject {
  virtual const char* type_name() const = 0;
  virtual std::optional<Value> get_attr(std::string_view name) const = 0;
  virtual std::string repr() const = 0;
  virtual bool callable() const { return false; }
  // Nesting depth of the values it holds (see Value::depth()).
  virtual uint32_t depth() const { return 1; }
  // Called for obj(...) when callable(); `self` is the Value holding this.
  virtual Value call(Evaluator& ev, const Value& self, CallArgs& args);
};

// --- Python semantics -------------------------------------------------------

const char* type_name(const Value& v);  // Python's type(v).__name__
bool truthy(const Value& v);
std::string to_str(const Value& v);     // str(v); "" for undefined
std::string repr(const Value& v);       // repr(v)
bool equals(const Value& a, const Value& b);
// Python's a < b (and friends via it); throws TemplateError for unorderable
// types ("'<' not supported between instances of 'str' and 'int'").
bool less(const Value& a, const Value& b, const char* op = "<");
// Iterates like Python's iter(): list/tuple/iterator items, dict keys, string
// code points, undefined -> nothing. Throws for non-iterables.
std::vector<Value> iterate(const Value& v);
// len(v); throws for values without a length.
int64_t length(const Value& v);
// Python's Py_ReprEnter for objects that can reach themselves (namespaces):
// true when `obj` is already being printed on this thread.
class ReprGuard {
 public:
  explicit ReprGuard(const void* obj);
  ~ReprGuard();
  bool recursive() const { return recursive_; }

 private:
  bool recursive_;  // (guards nest: the destructor pops the innermost entry)
};

// The error message jinja2 gives for an operation on an undefined value.
[[noreturn]] void fail_undefined(const Value& v);
// Python's hash-based set key for a hashable value (unique, dict keys);
// throws "unhashable type" for lists and dicts.
std::string hash_key(const Value& v);

}  // namespace serval::chat_template
