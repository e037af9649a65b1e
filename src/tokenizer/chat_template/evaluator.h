// The tree-walking evaluator of the chat-template renderer: jinja2's
// runtime semantics (scoping, loops, macros, Undefined) over the AST, under
// the budgets of ChatTemplateLimits. One Evaluator per render call; not
// shared between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/chat_template/ast.h"
#include "tokenizer/chat_template/chat_template.h"
#include "tokenizer/chat_template/value.h"

namespace serval::chat_template {

// A variable scope. Scopes chain lexically (loop bodies and macro calls get
// a child scope; `if` does not), as jinja2's compiled frames do.
struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  bool captured = false;  // a macro closure points here: do not recycle

  Value* find_local(std::string_view name) {
    for (auto& kv : vars) {
      if (kv.first == name) return &kv.second;
    }
    return nullptr;
  }
  void set(std::string_view name, Value v) {
    if (Value* p = find_local(name)) {
      *p = std::move(v);
    } else {
      vars.emplace_back(std::string(name), std::move(v));
    }
  }
};

class Evaluator {
 public:
  Evaluator(const ChatTemplateLimits& limits, const ChatTemplateRenderOptions& options);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Renders `program` with the variables of `context` (a dict Value).
  std::string render(const ast::Program& program, const Value& context);

  // --- services for builtins ------------------------------------------------
  const ChatTemplateLimits& limits() const { return limits_; }
  const ChatTemplateRenderOptions& options() const { return options_; }

  // Builds a string / list value, enforcing the size and allocation budgets.
  Value make_string(std::string s, bool safe = false);
  Value make_list(std::vector<Value> items, Seq seq = Seq::list);
  Value make_dict(std::shared_ptr<DictData> d);
  // Fails when a string being built would exceed max_output_bytes.
  void check_string_size(size_t n) const;
  void check_collection_size(size_t n) const;
  void charge_steps(uint64_t n);
  void count_iterations(uint64_t n);

  // iterate() for template code: iterating a string yields one value per
  // code point, so strings longer than max_loop_iterations are refused.
  std::vector<Value> iter(const Value& v);

  Value getattr(const Value& obj, std::string_view name);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& fn, CallArgs& args);
  Value call_filter(std::string_view name, const Value& subject, CallArgs& args);
  bool call_test(std::string_view name, const Value& subject, CallArgs& args);
  // Registers a namespace object so that render() can break reference
  // cycles through it at the end.
  void track(const std::shared_ptr<ObjectData>& ns) { tracked_.push_back(ns); }

  // The recursive `loop(...)` of `for ... recursive`.
  Value call_loop(const Value& loop_value, const Value& iterable);

 private:
  enum class Flow : uint8_t { normal, break_, continue_ };

  Value eval(const ast::Expr& e);
  Value eval_call(const ast::Expr& e, const Value* caller);
  void eval_call_args(const ast::Expr& e, CallArgs& out);
  Value eval_filter(const ast::Expr& e, const Value* injected);
  Value eval_binop(const ast::Expr& e);
  Value eval_compare(const ast::Expr& e);
  Value slice(const Value& obj, const ast::Expr& s);

  Flow exec_body(const ast::Body& body);
  Flow exec(const ast::Stmt& s);
  void exec_for(const ast::Stmt& s);
  void run_loop(const ast::Stmt& s, const Value& iterable, Scope* outer, int depth0);
  std::string capture(const ast::Body& body, Scope* scope);
  Value invoke_macro(const FunctionData& f, CallArgs& args);

  void assign(const ast::Target& t, const Value& v, Scope* scope);
  Value lookup(std::string_view name);
  void emit(std::string_view s);

  Scope* new_scope(Scope* parent);
  void release_scope(Scope* s);

  const ChatTemplateLimits& limits_;
  const ChatTemplateRenderOptions& options_;
  std::vector<std::unique_ptr<Scope>> scopes_;
  std::vector<Scope*> free_scopes_;
  std::vector<std::shared_ptr<ObjectData>> tracked_;
  Scope* scope_ = nullptr;
  const DictData* context_ = nullptr;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  uint64_t iterations_ = 0;
  uint64_t alloc_bytes_ = 0;
  size_t call_depth_ = 0;
  size_t eval_depth_ = 0;

  friend struct EvalGuard;
};

}  // namespace serval::chat_template
