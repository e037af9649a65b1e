// Syntax tree of a compiled chat template. Built once by the parser,
// immutable afterwards and shared by concurrent renders.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat_template/value.h"

namespace serval::chat_template::ast {

enum class ExprKind : uint8_t {
  constant,   // value
  name,       // name
  list,       // args = items
  tuple,      // args = items
  dict,       // args = key0, value0, key1, value1, ...
  getattr,    // args[0] . name
  getitem,    // args[0] [ args[1] ]
  slice,      // args = start, stop, step (each may be null)
  call,       // args[0] ( call_args, kwargs, dyn_args, dyn_kwargs )
  filter,     // args[0] (null inside filter blocks) | name ( call_args, kwargs )
  test,       // args[0] is name ( call_args, kwargs )
  not_,       // not args[0]
  neg,        // -args[0]
  pos,        // +args[0]
  binop,      // args[0] op args[1]
  concat,     // args joined with ~
  compare,    // args[0] ops[0] args[1] ops[1] args[2] ...
  and_,       // args[0] and args[1]
  or_,        // args[0] or args[1]
  condexpr,   // args[1] if args[0] else args[2] (args[2] may be null)
};

enum class BinOp : uint8_t { add, sub, mul, div, floordiv, mod, pow };
enum class CmpOp : uint8_t { eq, ne, lt, le, gt, ge, in, notin };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::constant;
  int line = 0;
  uint32_t depth = 1;  // nesting depth of this subtree (bounded by the parser)
  BinOp op = BinOp::add;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<CmpOp> cmp_ops;
  std::vector<ExprPtr> call_args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args;    // *args
  ExprPtr dyn_kwargs;  // **kwargs
};

// An assignment target: a name, a (nested) tuple of names, or ns.attr.
struct Target {
  enum class Kind : uint8_t { name, tuple, nsref };
  Kind kind = Kind::name;
  std::string name;
  std::string attr;  // nsref
  std::vector<Target> items;
};

enum class StmtKind : uint8_t {
  data,          // text
  output,        // {{ expr }}
  if_,           // branches (test, body) ..., else_body
  for_,          // for target in expr [if cond] [recursive]: body else else_body
  set,           // set target = expr
  set_block,     // set target [| filter]: body endset
  macro,         // macro name(params=defaults): body
  call_block,    // call(params) expr: body
  filter_block,  // filter f: body
  with,          // with targets = values: body
  scope,         // a body rendered in place (generation, block)
  break_,
  continue_,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Branch {
  ExprPtr test;
  Body body;
};

struct Stmt {
  StmtKind kind = StmtKind::data;
  int line = 0;
  std::string text;  // data; macro name
  ExprPtr expr;      // output / for iterable / set value / call expression / filter chain
  ExprPtr cond;      // for ... if cond
  Target target;     // for / set / set_block
  bool recursive = false;
  std::vector<Branch> branches;  // if / elif
  Body body;
  Body else_body;
  // macro / call block signature
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned with params; null = no default
  bool catch_varargs = false;     // the body reads `varargs`
  bool catch_kwargs = false;      // the body reads `kwargs`
  bool uses_caller = false;       // the body reads `caller`
  // with
  std::vector<Target> with_targets;
  std::vector<ExprPtr> with_values;
};

struct Program {
  Body body;
};

}  // namespace serval::chat_template::ast
