#include "tokenizer/chat_template/objects.h"

#include "tokenizer/chat_template/evaluator.h"

namespace serval::chat_template {

namespace {

Value bound(const char* name, BuiltinFn fn, Value self) {
  auto f = std::make_shared<FunctionData>();
  f->name = name;
  f->builtin = fn;
  f->depth = self.depth() + 1;
  f->self = std::move(self);
  return Value::function(std::move(f));
}

Value loop_cycle(Evaluator&, const Value& self, CallArgs& args) {
  const auto& loop = dynamic_cast<const LoopObj&>(self.object());
  if (args.pos.empty()) fail("no items for cycling given");
  return args.pos[static_cast<size_t>(loop.index0) % args.pos.size()];
}

Value loop_changed(Evaluator& ev, const Value& self, CallArgs& args) {
  const auto& loop = dynamic_cast<const LoopObj&>(self.object());
  Value v = ev.make_list(args.pos, Seq::list);
  if (!loop.last_changed || !equals(*loop.last_changed, v)) {
    loop.last_changed = v;
    return Value::boolean(true);
  }
  return Value::boolean(false);
}

Value cycler_next(Evaluator&, const Value& self, CallArgs&) {
  auto& c = dynamic_cast<CyclerObj&>(self.object());
  if (c.items.empty()) fail("cycler has no items");
  Value v = c.items[c.pos];
  c.pos = (c.pos + 1) % c.items.size();
  return v;
}

Value cycler_reset(Evaluator&, const Value& self, CallArgs&) {
  dynamic_cast<CyclerObj&>(self.object()).pos = 0;
  return Value::none();
}

}  // namespace

std::optional<Value> NamespaceObj::get_attr(std::string_view name) const {
  if (const Value* v = attrs.find(name)) return *v;
  return std::nullopt;
}

std::string NamespaceObj::repr() const {
  ReprGuard guard(this);
  if (guard.recursive()) return "<Namespace {...}>";
  std::string out = "<Namespace {";
  bool first = true;
  for (const auto& [k, v] : attrs.items) {
    if (!first) out += ", ";
    first = false;
    out += chat_template::repr(k) + ": " + chat_template::repr(v);
  }
  return out + "}>";
}

std::optional<Value> LoopObj::get_attr(std::string_view name) const {
  int64_t n = static_cast<int64_t>(items->size());
  if (name == "index0") return Value::integer(index0);
  if (name == "index") return Value::integer(index0 + 1);
  if (name == "revindex0") return Value::integer(n - index0 - 1);
  if (name == "revindex") return Value::integer(n - index0);
  if (name == "first") return Value::boolean(index0 == 0);
  if (name == "last") return Value::boolean(index0 == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth0") return Value::integer(depth0);
  if (name == "depth") return Value::integer(depth0 + 1);
  if (name == "previtem") {
    if (index0 == 0) return Value::undefined("there is no previous item");
    return (*items)[static_cast<size_t>(index0 - 1)];
  }
  if (name == "nextitem") {
    if (index0 + 1 >= n) return Value::undefined("there is no next item");
    return (*items)[static_cast<size_t>(index0 + 1)];
  }
  Value self = Value::object(std::const_pointer_cast<LoopObj>(shared_from_this()));
  if (name == "cycle") return bound("cycle", loop_cycle, self);
  if (name == "changed") return bound("changed", loop_changed, self);
  return std::nullopt;
}

std::string LoopObj::repr() const {
  return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items->size()) + ">";
}

Value LoopObj::call(Evaluator& ev, const Value& self, CallArgs& args) {
  if (args.pos.size() != 1 || !args.kw.empty()) fail("loop() takes exactly one argument");
  return ev.call_loop(self, args.pos[0]);
}

std::optional<Value> CyclerObj::get_attr(std::string_view name) const {
  Value self = Value::object(std::const_pointer_cast<CyclerObj>(shared_from_this()));
  if (name == "next") return bound("next", cycler_next, self);
  if (name == "reset") return bound("reset", cycler_reset, self);
  if (name == "current") {
    if (items.empty()) return Value::undefined("cycler has no items");
    return items[pos];
  }
  return std::nullopt;
}

Value JoinerObj::call(Evaluator& ev, const Value&, CallArgs&) {
  if (!used) {
    used = true;
    return ev.make_string("");
  }
  return ev.make_string(sep);
}

}  // namespace serval::chat_template
