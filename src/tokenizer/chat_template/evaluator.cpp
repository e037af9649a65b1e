#include "tokenizer/chat_template/evaluator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "tokenizer/chat_template/builtins.h"
#include "tokenizer/chat_template/objects.h"
#include "tokenizer/chat_template/py_string.h"

namespace serval::chat_template {

using ast::CmpOp;
using ast::Expr;
using ast::ExprKind;
using ast::Stmt;
using ast::StmtKind;

// Bounds the nesting of eval/exec frames (and so the C++ stack).
struct EvalGuard {
  explicit EvalGuard(Evaluator& ev) : ev_(ev) {
    if (++ev_.eval_depth_ > ev_.limits_.max_eval_depth) {
      fail_budget("template evaluation nested deeper than " + std::to_string(ev_.limits_.max_eval_depth) +
                  " levels");
    }
    if (++ev_.steps_ > ev_.limits_.max_steps) {
      fail_budget("template evaluation exceeded " + std::to_string(ev_.limits_.max_steps) + " steps");
    }
  }
  ~EvalGuard() { --ev_.eval_depth_; }
  Evaluator& ev_;
};

Evaluator::Evaluator(const ChatTemplateLimits& limits, const ChatTemplateRenderOptions& options)
    : limits_(limits), options_(options) {}

Evaluator::~Evaluator() {
  // Break reference cycles through namespace objects (ns.x = [ns]) and
  // destroy long chains of them without recursion.
  std::vector<Value> drop;
  for (auto& o : tracked_) {
    if (auto* ns = dynamic_cast<NamespaceObj*>(o.get())) {
      for (auto& kv : ns->attrs.items) drop.push_back(std::move(kv.second));
      ns->attrs = DictData();
    } else if (auto* c = dynamic_cast<CyclerObj*>(o.get())) {
      for (auto& v : c->items) drop.push_back(std::move(v));
      c->items.clear();
    }
  }
  for (auto& s : scopes_) s->vars.clear();
  drop.clear();
  tracked_.clear();
}

// --- budgets ------------------------------------------------------------------------

void Evaluator::check_string_size(size_t n) const {
  if (n > limits_.max_output_bytes) {
    fail_budget("string longer than " + std::to_string(limits_.max_output_bytes) + " bytes");
  }
}

void Evaluator::check_collection_size(size_t n) const {
  if (n > limits_.max_collection_size) {
    fail_budget("list or dict with more than " + std::to_string(limits_.max_collection_size) + " items");
  }
}

void Evaluator::charge_steps(uint64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) {
    fail_budget("template evaluation exceeded " + std::to_string(limits_.max_steps) + " steps");
  }
}

void Evaluator::count_iterations(uint64_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_loop_iterations) {
    fail_budget("template loops exceeded " + std::to_string(limits_.max_loop_iterations) + " iterations");
  }
}

Value Evaluator::make_string(std::string s, bool safe) {
  check_string_size(s.size());
  alloc_bytes_ += s.size();
  if (alloc_bytes_ > limits_.max_alloc_bytes) {
    fail_budget("template built more than " + std::to_string(limits_.max_alloc_bytes) + " bytes of values");
  }
  return Value::string(std::move(s), safe);
}

Value Evaluator::make_list(std::vector<Value> items, Seq seq) {
  check_collection_size(items.size());
  alloc_bytes_ += items.size() * sizeof(Value);
  if (alloc_bytes_ > limits_.max_alloc_bytes) {
    fail_budget("template built more than " + std::to_string(limits_.max_alloc_bytes) + " bytes of values");
  }
  charge_steps(items.size() / 16);
  return Value::list(std::move(items), seq);
}

Value Evaluator::make_dict(std::shared_ptr<DictData> d) {
  check_collection_size(d->items.size());
  alloc_bytes_ += d->items.size() * 2 * sizeof(Value);
  if (alloc_bytes_ > limits_.max_alloc_bytes) {
    fail_budget("template built more than " + std::to_string(limits_.max_alloc_bytes) + " bytes of values");
  }
  return Value::dict(std::move(d));
}

void Evaluator::emit(std::string_view s) {
  if (out_->size() + s.size() > limits_.max_output_bytes) {
    fail_budget("rendered output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
  }
  out_->append(s);
}

std::vector<Value> Evaluator::iter(const Value& v) {
  if (v.is_string()) {
    size_t n = py::cp_count(v.str());
    if (n > limits_.max_loop_iterations) {
      fail_budget("iterating a string of " + std::to_string(n) + " characters (more than " +
                  std::to_string(limits_.max_loop_iterations) + ")");
    }
  }
  return iterate(v);
}

// --- scopes ---------------------------------------------------------------------------

Scope* Evaluator::new_scope(Scope* parent) {
  Scope* s;
  if (!free_scopes_.empty()) {
    s = free_scopes_.back();
    free_scopes_.pop_back();
  } else {
    scopes_.push_back(std::make_unique<Scope>());
    s = scopes_.back().get();
  }
  s->parent = parent;
  s->captured = false;
  s->vars.clear();
  return s;
}

void Evaluator::release_scope(Scope* s) {
  if (s->captured) return;
  s->vars.clear();
  free_scopes_.push_back(s);
}

static void capture_chain(Scope* s) {
  for (; s && !s->captured; s = s->parent) s->captured = true;
}

Value Evaluator::lookup(std::string_view name) {
  for (Scope* s = scope_; s; s = s->parent) {
    if (Value* v = s->find_local(name)) return *v;
  }
  if (context_) {
    if (const Value* v = context_->find(name)) return *v;
  }
  if (auto g = find_global(name)) return *g;
  return Value::undefined("'" + std::string(name) + "' is undefined");
}

// --- render -----------------------------------------------------------------------------

std::string Evaluator::render(const ast::Program& program, const Value& context) {
  context_ = context.is_dict() ? &context.dict() : nullptr;
  std::string out;
  out_ = &out;
  scope_ = new_scope(nullptr);
  exec_body(program.body);
  return out;
}

std::string Evaluator::capture(const ast::Body& body, Scope* scope) {
  std::string buf;
  std::string* saved_out = out_;
  Scope* saved_scope = scope_;
  out_ = &buf;
  scope_ = scope;
  exec_body(body);
  out_ = saved_out;
  scope_ = saved_scope;
  return buf;
}

Evaluator::Flow Evaluator::exec_body(const ast::Body& body) {
  for (const auto& s : body) {
    Flow f = exec(*s);
    if (f != Flow::normal) return f;
  }
  return Flow::normal;
}

Evaluator::Flow Evaluator::exec(const Stmt& s) {
  EvalGuard guard(*this);
  try {
    switch (s.kind) {
      case StmtKind::data: emit(s.text); return Flow::normal;
      case StmtKind::output: {
        Value v = eval(*s.expr);
        if (v.is_string()) {
          emit(v.str());
        } else {
          std::string t = to_str(v);
          emit(t);
        }
        return Flow::normal;
      }
      case StmtKind::if_:
        for (const auto& br : s.branches) {
          if (truthy(eval(*br.test))) return exec_body(br.body);
        }
        return exec_body(s.else_body);
      case StmtKind::for_: exec_for(s); return Flow::normal;
      case StmtKind::set: assign(s.target, eval(*s.expr), scope_); return Flow::normal;
      case StmtKind::set_block: {
        Scope* child = new_scope(scope_);
        std::string text = capture(s.body, child);
        release_scope(child);
        Value v = make_string(std::move(text));
        if (s.expr) v = eval_filter(*s.expr, &v);
        assign(s.target, v, scope_);
        return Flow::normal;
      }
      case StmtKind::macro: {
        auto f = std::make_shared<FunctionData>();
        f->name = s.text;
        f->macro = &s;
        f->closure = scope_;
        capture_chain(scope_);
        scope_->set(s.text, Value::function(std::move(f)));
        return Flow::normal;
      }
      case StmtKind::call_block: {
        auto f = std::make_shared<FunctionData>();
        f->name = "caller";
        f->macro = &s;
        f->closure = scope_;
        capture_chain(scope_);
        Value caller = Value::function(std::move(f));
        Value v = eval_call(*s.expr, &caller);
        if (v.is_string()) {
          emit(v.str());
        } else {
          emit(to_str(v));
        }
        return Flow::normal;
      }
      case StmtKind::filter_block: {
        Scope* child = new_scope(scope_);
        std::string text = capture(s.body, child);
        release_scope(child);
        Value v = make_string(std::move(text));
        v = eval_filter(*s.expr, &v);
        emit(to_str(v));
        return Flow::normal;
      }
      case StmtKind::with: {
        Scope* child = new_scope(scope_);
        std::vector<Value> vals;
        for (const auto& e : s.with_values) vals.push_back(eval(*e));
        for (size_t i = 0; i < vals.size(); ++i) assign(s.with_targets[i], vals[i], child);
        Scope* saved = scope_;
        scope_ = child;
        Flow f = exec_body(s.body);
        scope_ = saved;
        release_scope(child);
        return f;
      }
      case StmtKind::scope: {
        Scope* child = new_scope(scope_);
        Scope* saved = scope_;
        scope_ = child;
        Flow f = exec_body(s.body);
        scope_ = saved;
        release_scope(child);
        return f;
      }
      case StmtKind::break_: return Flow::break_;
      case StmtKind::continue_: return Flow::continue_;
    }
  } catch (TemplateError& err) {
    if (err.line == 0) err.line = s.line;
    throw;
  }
  return Flow::normal;
}

void Evaluator::assign(const ast::Target& t, const Value& v, Scope* scope) {
  switch (t.kind) {
    case ast::Target::Kind::name: scope->set(t.name, v); return;
    case ast::Target::Kind::tuple: {
      if (!(v.is_list() || v.is_string() || v.is_dict() || v.is_undefined())) {
        fail(std::string("cannot unpack non-iterable ") + type_name(v) + " object");
      }
      std::vector<Value> items = iter(v);
      if (items.size() < t.items.size()) {
        fail("not enough values to unpack (expected " + std::to_string(t.items.size()) + ", got " +
             std::to_string(items.size()) + ")");
      }
      if (items.size() > t.items.size()) {
        fail("too many values to unpack (expected " + std::to_string(t.items.size()) + ")");
      }
      for (size_t i = 0; i < items.size(); ++i) assign(t.items[i], items[i], scope);
      return;
    }
    case ast::Target::Kind::nsref: {
      Value ns = lookup(t.name);
      auto* obj = ns.is_object() ? dynamic_cast<NamespaceObj*>(&ns.object()) : nullptr;
      if (!obj) fail("cannot assign attribute on non-namespace object");
      obj->attrs.set(Value::string(t.attr), v);
      return;
    }
  }
}

// --- loops ---------------------------------------------------------------------------------

void Evaluator::exec_for(const Stmt& s) {
  Value iterable = eval(*s.expr);
  run_loop(s, iterable, scope_, 0);
}

void Evaluator::run_loop(const Stmt& s, const Value& iterable, Scope* outer, int depth0) {
  if (!(iterable.is_list() || iterable.is_dict() || iterable.is_string() || iterable.is_undefined())) {
    fail(std::string("'") + type_name(iterable) + "' object is not iterable");
  }
  std::vector<Value> items = iter(iterable);
  Scope* saved = scope_;
  if (s.cond) {
    std::vector<Value> kept;
    for (Value& item : items) {
      count_iterations(1);
      Scope* tmp = new_scope(outer);
      scope_ = tmp;
      assign(s.target, item, tmp);
      bool keep = truthy(eval(*s.cond));
      scope_ = saved;
      release_scope(tmp);
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (!s.else_body.empty()) {
      Scope* child = new_scope(outer);
      scope_ = child;
      exec_body(s.else_body);
      scope_ = saved;
      release_scope(child);
    }
    return;
  }
  auto loop = std::make_shared<LoopObj>();
  for (const Value& v : items) loop->items_depth = std::max(loop->items_depth, v.depth());
  loop->items = std::make_shared<std::vector<Value>>(std::move(items));
  loop->stmt = &s;
  loop->outer = outer;
  loop->depth0 = depth0;
  Value loop_value = Value::object(loop);
  const auto& list = *loop->items;
  for (size_t i = 0; i < list.size(); ++i) {
    count_iterations(1);
    Scope* it = new_scope(outer);
    scope_ = it;
    assign(s.target, list[i], it);
    loop->index0 = static_cast<int64_t>(i);
    it->set("loop", loop_value);
    Flow f = exec_body(s.body);
    scope_ = saved;
    release_scope(it);
    if (f == Flow::break_) break;
  }
}

Value Evaluator::call_loop(const Value& loop_value, const Value& iterable) {
  auto* loop = dynamic_cast<LoopObj*>(&loop_value.object());
  if (!loop || !loop->stmt->recursive) {
    fail("Tried to call non recursive loop.  Maybe you forgot the 'recursive' modifier.");
  }
  if (++call_depth_ > limits_.max_call_depth) {
    --call_depth_;
    fail_budget("recursion deeper than " + std::to_string(limits_.max_call_depth) + " levels");
  }
  std::string buf;
  std::string* saved_out = out_;
  out_ = &buf;
  run_loop(*loop->stmt, iterable, loop->outer, loop->depth0 + 1);
  out_ = saved_out;
  --call_depth_;
  return make_string(std::move(buf));
}

// --- calls ------------------------------------------------------------------------------------

void Evaluator::eval_call_args(const Expr& e, CallArgs& out) {
  for (const auto& a : e.call_args) out.pos.push_back(eval(*a));
  if (e.dyn_args) {
    Value extra = eval(*e.dyn_args);
    if (!(extra.is_list() || extra.is_dict() || extra.is_string() || extra.is_undefined())) {
      fail(std::string("argument after * must be an iterable, not ") + type_name(extra));
    }
    for (Value& v : iter(extra)) out.pos.push_back(std::move(v));
  }
  for (const auto& [k, v] : e.kwargs) out.kw.emplace_back(k, eval(*v));
  if (e.dyn_kwargs) {
    Value extra = eval(*e.dyn_kwargs);
    if (!extra.is_dict()) fail(std::string("argument after ** must be a mapping, not ") + type_name(extra));
    for (const auto& [k, v] : extra.dict().items) {
      if (!k.is_string()) fail("keywords must be strings");
      out.kw.emplace_back(k.str(), v);
    }
  }
}

Value Evaluator::eval_call(const Expr& e, const Value* caller) {
  Value fn = eval(*e.args[0]);
  CallArgs args;
  eval_call_args(e, args);
  if (caller) args.kw.emplace_back("caller", *caller);
  return call(fn, args);
}

Value Evaluator::call(const Value& fn, CallArgs& args) {
  if (fn.is_function()) {
    const FunctionData& f = fn.function();
    if (f.macro) return invoke_macro(f, args);
    return f.builtin(*this, f.self, args);
  }
  if (fn.is_object() && fn.object().callable()) return fn.object().call(*this, fn, args);
  if (fn.is_undefined()) fail_undefined(fn);
  fail(std::string("'") + type_name(fn) + "' object is not callable");
}

Value Evaluator::invoke_macro(const FunctionData& f, CallArgs& args) {
  const Stmt& m = *f.macro;
  if (call_depth_ + 1 > limits_.max_call_depth) {
    fail_budget("macro recursion deeper than " + std::to_string(limits_.max_call_depth) + " levels");
  }
  size_t np = m.params.size();
  if (args.pos.size() > np && !m.catch_varargs) {
    fail("macro '" + f.name + "' takes not more than " + std::to_string(np) + " argument(s)");
  }
  ++call_depth_;
  Scope* s = new_scope(f.closure);
  Scope* saved = scope_;
  scope_ = s;
  auto take_kw = [&](const std::string& name, Value& out) {
    for (auto it = args.kw.begin(); it != args.kw.end(); ++it) {
      if (it->first == name) {
        out = std::move(it->second);
        args.kw.erase(it);
        return true;
      }
    }
    return false;
  };
  for (size_t i = 0; i < np; ++i) {
    const std::string& name = m.params[i];
    Value v;
    if (i < args.pos.size()) {
      v = args.pos[i];
    } else if (take_kw(name, v)) {
      // from a keyword
    } else if (m.defaults[i]) {
      v = eval(*m.defaults[i]);
    } else {
      v = Value::undefined("parameter '" + name + "' was not provided");
    }
    s->set(name, std::move(v));
  }
  if (m.uses_caller && std::find(m.params.begin(), m.params.end(), "caller") == m.params.end()) {
    Value c;
    if (!take_kw("caller", c)) {
      c = f.caller.is_undefined() ? Value::undefined("No caller defined") : f.caller;
    }
    s->set("caller", std::move(c));
  }
  if (m.catch_kwargs) {
    auto d = std::make_shared<DictData>();
    for (auto& [k, v] : args.kw) d->set(Value::string(k), v);
    s->set("kwargs", make_dict(std::move(d)));
  } else if (!args.kw.empty()) {
    if (args.kw.front().first == "caller") {
      fail("macro '" + f.name + "' was invoked with two values for the special caller argument");
    }
    fail("macro '" + f.name + "' takes no keyword argument '" + args.kw.front().first + "'");
  }
  if (m.catch_varargs) {
    std::vector<Value> extra;
    for (size_t i = np; i < args.pos.size(); ++i) extra.push_back(args.pos[i]);
    s->set("varargs", make_list(std::move(extra), Seq::tuple));
  }
  std::string text = capture(m.body, s);
  scope_ = saved;
  release_scope(s);
  --call_depth_;
  return make_string(std::move(text));
}

Value Evaluator::call_filter(std::string_view name, const Value& subject, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) fail("no filter named '" + std::string(name) + "'");
  return f(*this, subject, args);
}

bool Evaluator::call_test(std::string_view name, const Value& subject, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) fail("no test named '" + std::string(name) + "'");
  return t(*this, subject, args);
}

// --- attribute and item access -------------------------------------------------------------

namespace {

std::string object_desc(const Value& v) {
  if (v.is_none()) return "None";
  return std::string(type_name(v)) + " object";
}

Value no_attribute(const Value& obj, std::string_view name) {
  return Value::undefined("'" + object_desc(obj) + "' has no attribute '" + std::string(name) + "'");
}

}  // namespace

Value Evaluator::getattr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') {
    return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type_name(obj) +
                            "' object is unsafe.");
  }
  if (obj.is_list() && obj.list().group_tuple) {
    if (name == "grouper") return obj.list().items[0];
    if (name == "list") return obj.list().items[1];
  }
  if (obj.is_dict() || obj.is_string() || obj.is_list()) {
    if (auto m = find_method(obj, name)) return *m;
    if (obj.is_dict()) {
      if (const Value* v = obj.dict().find(name)) return *v;
    }
    return no_attribute(obj, name);
  }
  if (obj.is_object()) {
    if (auto v = obj.object().get_attr(name)) return *v;
  }
  return no_attribute(obj, name);
}

Value Evaluator::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto by_attr = [&]() -> Value {
    if (key.is_string()) {
      const std::string& name = key.str();
      if (name.size() >= 2 && name[0] == '_' && name[1] == '_') {
        return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
      }
      if (obj.is_dict() || obj.is_string() || obj.is_list()) {
        if (auto m = find_method(obj, name)) return *m;
      } else if (obj.is_object()) {
        if (auto v = obj.object().get_attr(name)) return *v;
      }
      return no_attribute(obj, name);
    }
    return Value::undefined("'" + object_desc(obj) + "' has no attribute " + repr(key));
  };
  switch (obj.kind()) {
    case Kind::dict: {
      if ((key.is_list() && key.seq() != Seq::tuple) || key.is_dict()) return by_attr();  // unhashable
      if (const Value* v = obj.dict().find(key)) return *v;
      return by_attr();
    }
    case Kind::list: {
      if (obj.seq() != Seq::iterator && (key.is_int() || key.is_bool())) {
        const auto& items = obj.list().items;
        int64_t i = key.as_int();
        int64_t n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) {
          return Value::undefined("'" + object_desc(obj) + "' has no element " + std::to_string(key.as_int()));
        }
        return items[static_cast<size_t>(i)];
      }
      return by_attr();
    }
    case Kind::string: {
      if (key.is_int() || key.is_bool()) {
        auto c = py::index(obj.str(), key.as_int());
        if (!c) return Value::undefined("'str object' has no element " + std::to_string(key.as_int()));
        return make_string(std::move(*c), obj.safe());
      }
      return by_attr();
    }
    default: return by_attr();
  }
}

// jinja2 compiles x[a:b:c] to a plain Python subscript (not the sandbox's
// getitem), so every failure raises.
Value Evaluator::slice(const Value& obj, const Expr& s) {
  std::optional<int64_t> bounds[3];
  bool bad = false;
  for (int i = 0; i < 3; ++i) {
    if (!s.args[i]) continue;
    Value b = eval(*s.args[i]);
    if (b.is_none()) continue;
    if (b.is_int() || b.is_bool()) {
      bounds[i] = b.as_int();
    } else {
      bad = true;
    }
  }
  if (obj.is_undefined()) fail_undefined(obj);
  if (!(obj.is_string() || (obj.is_list() && obj.seq() != Seq::iterator))) {
    if (obj.is_dict()) fail("unhashable type: 'slice'");
    fail(std::string("'") + type_name(obj) + "' object is not subscriptable");
  }
  if (bad) fail("slice indices must be integers or None or have an __index__ method");
  int64_t step = bounds[2].value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  if (obj.is_string()) {
    charge_steps(obj.str().size() / 64);
    return make_string(py::slice(obj.str(), bounds[0], bounds[1], step), obj.safe());
  }
  if (obj.is_list() && obj.seq() != Seq::iterator) {
    const auto& items = obj.list().items;
    py::SliceRange r = py::slice_range(static_cast<int64_t>(items.size()), bounds[0], bounds[1], step);
    std::vector<Value> out;
    out.reserve(static_cast<size_t>(r.count));
    for (int64_t k = 0, i = r.start; k < r.count; ++k, i += r.step) out.push_back(items[static_cast<size_t>(i)]);
    return make_list(std::move(out), obj.seq());
  }
  fail(std::string("'") + type_name(obj) + "' object is not subscriptable");
}

// --- expressions ---------------------------------------------------------------------------------

Value Evaluator::eval(const Expr& e) {
  EvalGuard guard(*this);
  try {
    switch (e.kind) {
      case ExprKind::constant: return e.value;
      case ExprKind::name: return lookup(e.name);
      case ExprKind::list:
      case ExprKind::tuple: {
        std::vector<Value> items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) items.push_back(eval(*a));
        return make_list(std::move(items), e.kind == ExprKind::tuple ? Seq::tuple : Seq::list);
      }
      case ExprKind::dict: {
        auto d = std::make_shared<DictData>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          Value v = eval(*e.args[i + 1]);
          d->set(std::move(k), std::move(v));
        }
        return make_dict(std::move(d));
      }
      case ExprKind::getattr: return getattr(eval(*e.args[0]), e.name);
      case ExprKind::getitem: {
        Value obj = eval(*e.args[0]);
        if (e.args[1]->kind == ExprKind::slice) return slice(obj, *e.args[1]);
        return getitem(obj, eval(*e.args[1]));
      }
      case ExprKind::slice: fail("slice outside of a subscript");
      case ExprKind::call: return eval_call(e, nullptr);
      case ExprKind::filter: return eval_filter(e, nullptr);
      case ExprKind::test: {
        Value subject = eval(*e.args[0]);
        CallArgs args;
        eval_call_args(e, args);
        return Value::boolean(call_test(e.name, subject, args));
      }
      case ExprKind::not_: return Value::boolean(!truthy(eval(*e.args[0])));
      case ExprKind::neg:
      case ExprKind::pos: {
        Value v = eval(*e.args[0]);
        if (v.is_undefined()) fail_undefined(v);
        bool neg = e.kind == ExprKind::neg;
        if (v.is_int() || v.is_bool()) {
          int64_t i = v.as_int();
          if (neg && i == std::numeric_limits<int64_t>::min()) fail("integer overflow");
          return Value::integer(neg ? -i : i);
        }
        if (v.is_float()) return Value::floating(neg ? -v.as_double() : v.as_double());
        fail(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + type_name(v) + "'");
      }
      case ExprKind::binop: return eval_binop(e);
      case ExprKind::concat: {
        std::string out;
        for (const auto& a : e.args) {
          Value v = eval(*a);
          if (v.is_string()) {
            out += v.str();
          } else {
            out += to_str(v);
          }
          check_string_size(out.size());
        }
        return make_string(std::move(out));
      }
      case ExprKind::compare: return eval_compare(e);
      case ExprKind::and_: {
        Value a = eval(*e.args[0]);
        if (!truthy(a)) return a;
        return eval(*e.args[1]);
      }
      case ExprKind::or_: {
        Value a = eval(*e.args[0]);
        if (truthy(a)) return a;
        return eval(*e.args[1]);
      }
      case ExprKind::condexpr: {
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      }
    }
  } catch (TemplateError& err) {
    if (err.line == 0) err.line = e.line;
    throw;
  }
  return Value();
}

Value Evaluator::eval_filter(const Expr& e, const Value* injected) {
  Value subject;
  if (!e.args[0]) {
    subject = *injected;
  } else if (e.args[0]->kind == ExprKind::filter && injected) {
    subject = eval_filter(*e.args[0], injected);
  } else {
    subject = eval(*e.args[0]);
  }
  CallArgs args;
  eval_call_args(e, args);
  return call_filter(e.name, subject, args);
}

namespace {

bool add_overflows(int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); }
bool sub_overflows(int64_t a, int64_t b, int64_t* r) { return __builtin_sub_overflow(a, b, r); }
bool mul_overflows(int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); }

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  fail(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" + type_name(b) +
       "'");
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  if (m == 0) m = std::copysign(0.0, b);
  return m;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Value Evaluator::eval_binop(const Expr& e) {
  Value a = eval(*e.args[0]);
  Value b = eval(*e.args[1]);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  bool nums = a.is_number() && b.is_number();
  switch (e.op) {
    case ast::BinOp::add:
      if (ints) {
        int64_t r;
        if (add_overflows(a.as_int(), b.as_int(), &r)) fail("integer overflow");
        return Value::integer(r);
      }
      if (nums) return Value::floating(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        bool safe = a.safe() || b.safe();
        size_t n = a.str().size() + b.str().size();
        check_string_size(n);
        std::string out;
        if (safe && !a.safe()) {
          out = py::html_escape(a.str());
        } else {
          out = a.str();
        }
        out += (safe && !b.safe()) ? py::html_escape(b.str()) : b.str();
        return make_string(std::move(out), safe);
      }
      if (a.is_list() && b.is_list() && a.seq() == b.seq() && a.seq() != Seq::iterator) {
        std::vector<Value> out = a.list().items;
        out.insert(out.end(), b.list().items.begin(), b.list().items.end());
        return make_list(std::move(out), a.seq());
      }
      if (a.is_string()) {
        fail(std::string("can only concatenate str (not \"") + type_name(b) + "\") to str");
      }
      if (a.is_list() && a.seq() == Seq::list) {
        fail(std::string("can only concatenate list (not \"") + type_name(b) + "\") to list");
      }
      unsupported("+", a, b);
    case ast::BinOp::sub:
      if (ints) {
        int64_t r;
        if (sub_overflows(a.as_int(), b.as_int(), &r)) fail("integer overflow");
        return Value::integer(r);
      }
      if (nums) return Value::floating(a.as_double() - b.as_double());
      unsupported("-", a, b);
    case ast::BinOp::mul: {
      if (ints) {
        int64_t r;
        if (mul_overflows(a.as_int(), b.as_int(), &r)) fail("integer overflow");
        return Value::integer(r);
      }
      if (nums) return Value::floating(a.as_double() * b.as_double());
      const Value* seq = nullptr;
      const Value* count = nullptr;
      if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
        seq = &a;
        count = &b;
      } else if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
        seq = &b;
        count = &a;
      }
      if (seq && !(seq->is_list() && seq->seq() == Seq::iterator)) {
        int64_t n = std::max<int64_t>(0, count->as_int());
        if (seq->is_string()) {
          const std::string& s = seq->str();
          if (!s.empty() && static_cast<uint64_t>(n) > limits_.max_output_bytes / s.size()) {
            check_string_size(limits_.max_output_bytes + 1);
          }
          std::string out;
          out.reserve(s.size() * static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) out += s;
          return make_string(std::move(out), seq->safe());
        }
        const auto& items = seq->list().items;
        if (!items.empty() && static_cast<uint64_t>(n) > limits_.max_collection_size / items.size()) {
          check_collection_size(limits_.max_collection_size + 1);
        }
        std::vector<Value> out;
        out.reserve(items.size() * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
        return make_list(std::move(out), seq->seq());
      }
      if (a.is_string() || b.is_string()) {
        fail(std::string("can't multiply sequence by non-int of type '") +
             type_name(a.is_string() ? b : a) + "'");
      }
      unsupported("*", a, b);
    }
    case ast::BinOp::div:
      if (nums) {
        if (b.as_double() == 0) fail("division by zero");
        return Value::floating(a.as_double() / b.as_double());
      }
      unsupported("/", a, b);
    case ast::BinOp::floordiv:
      if (ints) {
        if (b.as_int() == 0) fail("integer division or modulo by zero");
        if (a.as_int() == std::numeric_limits<int64_t>::min() && b.as_int() == -1) fail("integer overflow");
        return Value::integer(floor_div(a.as_int(), b.as_int()));
      }
      if (nums) {
        if (b.as_double() == 0) fail("float floor division by zero");
        double x = a.as_double(), y = b.as_double();
        double m = py_fmod(x, y);
        return Value::floating(std::round((x - m) / y));
      }
      unsupported("//", a, b);
    case ast::BinOp::mod:
      if (ints) {
        if (b.as_int() == 0) fail("integer division or modulo by zero");
        if (b.as_int() == -1) return Value::integer(0);
        int64_t m = a.as_int() % b.as_int();
        if (m != 0 && ((m < 0) != (b.as_int() < 0))) m += b.as_int();
        return Value::integer(m);
      }
      if (nums) {
        if (b.as_double() == 0) fail("float modulo");
        return Value::floating(py_fmod(a.as_double(), b.as_double()));
      }
      if (a.is_string()) return py_percent_format(*this, a, b);
      unsupported("%", a, b);
    case ast::BinOp::pow:
      if (ints && b.as_int() >= 0) {
        int64_t base = a.as_int(), exp = b.as_int(), r = 1;
        while (exp > 0) {
          if (exp & 1) {
            if (mul_overflows(r, base, &r)) fail("integer overflow");
          }
          exp >>= 1;
          if (exp > 0 && mul_overflows(base, base, &base)) fail("integer overflow");
        }
        return Value::integer(r);
      }
      if (nums) {
        if (a.as_double() == 0 && b.as_double() < 0) fail("0.0 cannot be raised to a negative power");
        return Value::floating(std::pow(a.as_double(), b.as_double()));
      }
      unsupported("** or pow()", a, b);
  }
  return Value();
}

namespace {

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::undefined: return false;
    case Kind::string:
      if (!item.is_string()) {
        if (item.is_undefined()) fail_undefined(item);
        fail(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::list:
      for (const Value& v : container.list().items) {
        if (equals(v, item)) return true;
      }
      return false;
    case Kind::dict: return container.dict().find(item) != nullptr;
    default: fail(std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

bool compare_op(CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::eq: return equals(a, b);
    case CmpOp::ne: return !equals(a, b);
    case CmpOp::lt: return less(a, b, "<");
    case CmpOp::le: return less(a, b, "<=") || equals(a, b);
    case CmpOp::gt: return less(b, a, ">");
    case CmpOp::ge: return less(b, a, ">=") || equals(a, b);
    case CmpOp::in: return contains(b, a);
    case CmpOp::notin: return !contains(b, a);
  }
  return false;
}

}  // namespace

bool value_contains(const Value& container, const Value& item) { return contains(container, item); }

Value Evaluator::eval_compare(const Expr& e) {
  Value left = eval(*e.args[0]);
  for (size_t i = 0; i < e.cmp_ops.size(); ++i) {
    Value right = eval(*e.args[i + 1]);
    if (!compare_op(e.cmp_ops[i], left, right)) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

}  // namespace serval::chat_template
