#include "tokenizer/chat_template/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "tokenizer/chat_template/builtins.h"
#include "tokenizer/chat_template/lexer.h"

namespace serval::chat_template {

namespace {

using ast::Body;
using ast::CmpOp;
using ast::Expr;
using ast::ExprKind;
using ast::ExprPtr;
using ast::Stmt;
using ast::StmtKind;
using ast::StmtPtr;
using ast::Target;

class Parser {
 public:
  Parser(std::vector<Token> toks, const ParseLimits& limits) : toks_(std::move(toks)), limits_(limits) {}

  std::unique_ptr<ast::Program> parse() {
    auto prog = std::make_unique<ast::Program>();
    prog->body = subparse({});
    if (cur().type != TokType::eof) fail_at(cur().line, "unexpected " + desc(cur()));
    return prog;
  }

 private:
  // --- token stream ---------------------------------------------------------

  const Token& cur() const { return toks_[pos_]; }
  const Token& look() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }

  bool is_op(const Token& t, std::string_view o) const { return t.type == TokType::op && t.text == o; }
  bool is_name(const Token& t, std::string_view n) const { return t.type == TokType::name && t.text == n; }
  bool skip_op(std::string_view o) {
    if (is_op(cur(), o)) {
      next();
      return true;
    }
    return false;
  }
  bool skip_name(std::string_view n) {
    if (is_name(cur(), n)) {
      next();
      return true;
    }
    return false;
  }

  static std::string desc(const Token& t) {
    switch (t.type) {
      case TokType::name:
      case TokType::op: return "'" + t.text + "'";
      case TokType::string: return "string";
      case TokType::integer:
      case TokType::floating: return "number " + t.text;
      default: return describe(t.type);
    }
  }

  [[noreturn]] void fail_at(int line, std::string msg) const {
    throw TemplateError{StatusCode::invalid_argument, "syntax error: " + std::move(msg), line};
  }

  void expect_op(std::string_view o) {
    if (!is_op(cur(), o)) fail_at(cur().line, "expected '" + std::string(o) + "', got " + desc(cur()));
    next();
  }
  const Token& expect_name() {
    if (cur().type != TokType::name) fail_at(cur().line, "expected a name, got " + desc(cur()));
    return next();
  }
  void expect_name(std::string_view n) {
    if (!is_name(cur(), n)) fail_at(cur().line, "expected '" + std::string(n) + "', got " + desc(cur()));
    next();
  }
  void expect(TokType t) {
    if (cur().type != t) {
      fail_at(cur().line, std::string("expected ") + describe(t) + ", got " + desc(cur()));
    }
    next();
  }

  // --- bounds -----------------------------------------------------------------

  struct Guard {
    Guard(Parser& p, size_t& counter, size_t limit, const char* what) : c(counter) {
      if (++c > limit) {
        throw TemplateError{StatusCode::resource_exhausted,
                            std::string("template too deeply nested: more than ") + std::to_string(limit) + " " +
                                what,
                            p.cur().line};
      }
    }
    ~Guard() { --c; }
    size_t& c;
  };

  ExprPtr node(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // Computes the subtree depth of a finished node and enforces the limit.
  ExprPtr seal(ExprPtr e) {
    uint32_t d = 0;
    auto see = [&](const ExprPtr& c) {
      if (c) d = std::max(d, c->depth);
    };
    for (const auto& c : e->args) see(c);
    for (const auto& c : e->call_args) see(c);
    for (const auto& kv : e->kwargs) see(kv.second);
    see(e->dyn_args);
    see(e->dyn_kwargs);
    e->depth = d + 1;
    if (e->depth > limits_.max_expression_depth) {
      throw TemplateError{StatusCode::resource_exhausted,
                          "expression too deeply nested: more than " +
                              std::to_string(limits_.max_expression_depth) + " levels",
                          e->line};
    }
    return e;
  }

  // --- statements ---------------------------------------------------------------

  // Parses until a block whose tag name is one of `end_tokens` (left current).
  Body subparse(std::initializer_list<std::string_view> end_tokens) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokType::eof) return body;
      if (t.type == TokType::data) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::data;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == TokType::variable_begin) {
        int line = t.line;
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::output;
        s->line = line;
        s->expr = parse_tuple(false, true, {}, false);
        expect(TokType::variable_end);
        body.push_back(std::move(s));
      } else if (t.type == TokType::block_begin) {
        next();
        if (cur().type == TokType::name) {
          for (std::string_view e : end_tokens) {
            if (cur().text == e) return body;
          }
        }
        StmtPtr s = parse_statement();
        if (s) body.push_back(std::move(s));
        expect(TokType::block_end);
      } else {
        fail_at(t.line, "unexpected " + desc(t));
      }
    }
  }

  static std::string join_names(std::initializer_list<std::string_view> names) {
    std::string out;
    for (std::string_view n : names) {
      if (!out.empty()) out += " or ";
      out += '\'';
      out += n;
      out += '\'';
    }
    return out;
  }

  Body parse_statements(std::initializer_list<std::string_view> end_tokens, bool drop_needle) {
    Guard g(*this, block_depth_, limits_.max_block_depth, "nested blocks");
    skip_op(":");
    expect(TokType::block_end);
    Body body = subparse(end_tokens);
    if (cur().type == TokType::eof) {
      std::string tag = tag_stack_.empty() ? std::string("block") : tag_stack_.back();
      fail_at(cur().line, "unexpected end of template: the '" + tag + "' block is not closed (expected " +
                              join_names(end_tokens) + ")");
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    if (t.type != TokType::name) fail_at(t.line, "tag name expected");
    std::string tag = t.text;
    int line = t.line;
    tag_stack_.push_back(tag);
    StmtPtr s;
    if (tag == "for") {
      s = parse_for();
    } else if (tag == "if") {
      s = parse_if();
    } else if (tag == "set") {
      s = parse_set();
    } else if (tag == "macro") {
      s = parse_macro();
    } else if (tag == "call") {
      s = parse_call_block();
    } else if (tag == "filter") {
      s = parse_filter_block();
    } else if (tag == "with") {
      s = parse_with();
    } else if (tag == "print") {
      // {% print a, b %} writes a then b (jinja2's Output of several nodes).
      next();
      s = std::make_unique<Stmt>();
      s->kind = StmtKind::scope;
      s->line = line;
      while (cur().type != TokType::block_end) {
        if (!s->body.empty()) expect_op(",");
        auto o = std::make_unique<Stmt>();
        o->kind = StmtKind::output;
        o->line = cur().line;
        o->expr = parse_expression(true);
        s->body.push_back(std::move(o));
      }
    } else if (tag == "break" || tag == "continue") {
      next();
      if (loop_depth_ == 0) fail_at(line, "'" + tag + "' outside of a loop");
      s = std::make_unique<Stmt>();
      s->kind = tag == "break" ? StmtKind::break_ : StmtKind::continue_;
      s->line = line;
    } else if (tag == "generation") {
      // Hugging Face's AssistantTracker extension: renders its body in place.
      next();
      s = std::make_unique<Stmt>();
      s->kind = StmtKind::scope;
      s->line = line;
      s->body = parse_statements({"endgeneration"}, true);
    } else if (tag == "block") {
      next();
      expect_name();
      skip_name("scoped");
      skip_name("required");
      s = std::make_unique<Stmt>();
      s->kind = StmtKind::scope;
      s->line = line;
      s->body = parse_statements({"endblock"}, true);
      if (cur().type == TokType::name) next();  // {% endblock name %}
    } else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
               tag == "autoescape") {
      fail_at(line, "the '" + tag + "' tag is not supported in chat templates");
    } else {
      fail_at(line, "encountered unknown tag '" + tag + "'");
    }
    tag_stack_.pop_back();
    return s;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::for_;
    s->line = cur().line;
    expect_name("for");
    s->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    s->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text == "else") s->else_body = parse_statements({"endfor"}, true);
    return s;
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::if_;
    s->line = cur().line;
    expect_name("if");
    while (true) {
      ast::Branch br;
      br.test = parse_tuple(false, false, {}, false);
      br.body = parse_statements({"elif", "else", "endif"}, false);
      s->branches.push_back(std::move(br));
      const Token& t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") s->else_body = parse_statements({"endif"}, true);
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    auto s = std::make_unique<Stmt>();
    s->line = cur().line;
    next();
    s->target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      s->kind = StmtKind::set;
      s->expr = parse_tuple(false, true, {}, false);
      return s;
    }
    s->kind = StmtKind::set_block;
    s->expr = parse_filter(nullptr, false);
    s->body = parse_statements({"endset"}, true);
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(cur(), ")")) {
      if (!s.params.empty()) expect_op(",");
      const Token& n = expect_name();
      if (n.text == "true" || n.text == "false" || n.text == "none" || n.text == "True" || n.text == "False" ||
          n.text == "None") {
        fail_at(n.line, "can't assign to constant '" + n.text + "'");
      }
      s.params.push_back(n.text);
      if (skip_op("=")) {
        s.defaults.push_back(parse_expression(true));
      } else {
        if (std::any_of(s.defaults.begin(), s.defaults.end(), [](const ExprPtr& d) { return d != nullptr; })) {
          fail_at(n.line, "non-default argument follows default argument");
        }
        s.defaults.push_back(nullptr);
      }
    }
    expect_op(")");
  }

  // Name loads inside macro bodies decide whether a macro takes varargs,
  // kwargs and caller (as jinja2's find_undeclared does).
  void note_name(const std::string& n) {
    if (n == "varargs" || n == "kwargs" || n == "caller") {
      for (auto& f : macro_names_) f.push_back(n);
    }
  }

  void finish_macro(Stmt& s) {
    auto& names = macro_names_.back();
    auto has = [&](const char* n) {
      return std::find(names.begin(), names.end(), n) != names.end() &&
             std::find(s.params.begin(), s.params.end(), n) == s.params.end();
    };
    s.catch_varargs = has("varargs");
    s.catch_kwargs = has("kwargs");
    s.uses_caller = has("caller") || std::find(s.params.begin(), s.params.end(), "caller") != s.params.end();
    macro_names_.pop_back();
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::macro;
    s->line = cur().line;
    next();
    s->text = expect_name().text;
    parse_signature(*s);
    macro_names_.emplace_back();
    size_t saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endmacro"}, true);
    loop_depth_ = saved_loops;
    finish_macro(*s);
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::call_block;
    s->line = cur().line;
    next();
    if (is_op(cur(), "(")) parse_signature(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::call) fail_at(s->line, "expected call");
    macro_names_.emplace_back();
    size_t saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endcall"}, true);
    loop_depth_ = saved_loops;
    finish_macro(*s);
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::filter_block;
    s->line = cur().line;
    next();
    s->expr = parse_filter(nullptr, true);
    s->body = parse_statements({"endfilter"}, true);
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::with;
    s->line = cur().line;
    next();
    while (cur().type != TokType::block_end) {
      if (!s->with_targets.empty()) expect_op(",");
      s->with_targets.push_back(parse_assign_target(true, false, {}, false));
      expect_op("=");
      s->with_values.push_back(parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true);
    return s;
  }

  Target to_target(const Expr& e) {
    Target t;
    if (e.kind == ExprKind::name) {
      t.kind = Target::Kind::name;
      t.name = e.name;
      return t;
    }
    if (e.kind == ExprKind::tuple) {
      t.kind = Target::Kind::tuple;
      for (const auto& it : e.args) t.items.push_back(to_target(*it));
      return t;
    }
    fail_at(e.line, "can't assign to this expression");
  }

  Target parse_assign_target(bool with_tuple, bool name_only, std::initializer_list<std::string_view> extra_end,
                             bool with_namespace) {
    if (with_namespace && cur().type == TokType::name && is_op(look(), ".")) {
      Target t;
      t.kind = Target::Kind::nsref;
      t.name = next().text;
      next();  // .
      t.attr = expect_name().text;
      return t;
    }
    if (name_only) {
      Target t;
      t.name = expect_name().text;
      return t;
    }
    ExprPtr e = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
    return to_target(*e);
  }

  // --- expressions ------------------------------------------------------------------

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = cur();
    if (t.type == TokType::variable_end || t.type == TokType::block_end || is_op(t, ")")) return true;
    if (t.type == TokType::name) {
      for (std::string_view e : extra_end) {
        if (t.text == e) return true;
      }
    }
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                      bool explicit_parentheses) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified) {
        items.push_back(parse_primary());
      } else {
        items.push_back(parse_expression(with_condexpr));
      }
      if (is_op(cur(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
      line = cur().line;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) fail_at(cur().line, "expected an expression, got " + desc(cur()));
    }
    auto t = node(ExprKind::tuple, line);
    t->args = std::move(items);
    return seal(std::move(t));
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Guard g(*this, expr_depth_, limits_.max_expression_depth, "expression levels");
    if (with_condexpr) return parse_condexpr();
    return parse_or();
  }

  ExprPtr parse_condexpr() {
    Guard g(*this, expr_depth_, limits_.max_expression_depth, "expression levels");
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      auto c = node(ExprKind::condexpr, line);
      c->args.push_back(std::move(expr2));
      c->args.push_back(std::move(expr1));
      c->args.push_back(std::move(expr3));
      expr1 = seal(std::move(c));
      line = cur().line;
    }
    return expr1;
  }

  ExprPtr binary(ExprKind k, int line, ExprPtr a, ExprPtr b) {
    auto e = node(k, line);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return seal(std::move(e));
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      ExprPtr right = parse_and();
      left = binary(ExprKind::or_, line, std::move(left), std::move(right));
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      ExprPtr right = parse_not();
      left = binary(ExprKind::and_, line, std::move(left), std::move(right));
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name(cur(), "not")) {
      Guard g(*this, expr_depth_, limits_.max_expression_depth, "expression levels");
      int line = next().line;
      auto e = node(ExprKind::not_, line);
      e->args.push_back(parse_not());
      return seal(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    std::vector<CmpOp> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      const Token& t = cur();
      CmpOp op;
      if (is_op(t, "==")) {
        op = CmpOp::eq;
      } else if (is_op(t, "!=")) {
        op = CmpOp::ne;
      } else if (is_op(t, "<")) {
        op = CmpOp::lt;
      } else if (is_op(t, "<=")) {
        op = CmpOp::le;
      } else if (is_op(t, ">")) {
        op = CmpOp::gt;
      } else if (is_op(t, ">=")) {
        op = CmpOp::ge;
      } else if (is_name(t, "in")) {
        op = CmpOp::in;
      } else if (is_name(t, "not") && is_name(look(), "in")) {
        next();
        op = CmpOp::notin;
      } else {
        break;
      }
      next();
      ops.push_back(op);
      operands.push_back(parse_math1());
      line = cur().line;
    }
    if (ops.empty()) return expr;
    auto c = node(ExprKind::compare, line);
    c->args.push_back(std::move(expr));
    for (auto& o : operands) c->args.push_back(std::move(o));
    c->cmp_ops = std::move(ops);
    return seal(std::move(c));
  }

  ExprPtr arith(int line, ast::BinOp op, ExprPtr a, ExprPtr b) {
    auto e = node(ExprKind::binop, line);
    e->op = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return seal(std::move(e));
  }

  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op(cur(), "+") || is_op(cur(), "-")) {
      ast::BinOp op = next().text == "+" ? ast::BinOp::add : ast::BinOp::sub;
      ExprPtr right = parse_concat();
      left = arith(line, op, std::move(left), std::move(right));
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    std::vector<ExprPtr> args;
    args.push_back(parse_math2());
    while (is_op(cur(), "~")) {
      next();
      args.push_back(parse_math2());
    }
    if (args.size() == 1) return std::move(args[0]);
    auto e = node(ExprKind::concat, line);
    e->args = std::move(args);
    return seal(std::move(e));
  }

  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr left = parse_pow();
    while (true) {
      ast::BinOp op;
      if (is_op(cur(), "*")) {
        op = ast::BinOp::mul;
      } else if (is_op(cur(), "/")) {
        op = ast::BinOp::div;
      } else if (is_op(cur(), "//")) {
        op = ast::BinOp::floordiv;
      } else if (is_op(cur(), "%")) {
        op = ast::BinOp::mod;
      } else {
        break;
      }
      next();
      ExprPtr right = parse_pow();
      left = arith(line, op, std::move(left), std::move(right));
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (is_op(cur(), "**")) {
      next();
      ExprPtr right = parse_unary(true);
      left = arith(line, ast::BinOp::pow, std::move(left), std::move(right));
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Guard g(*this, expr_depth_, limits_.max_expression_depth, "expression levels");
    int line = cur().line;
    ExprPtr n;
    if (is_op(cur(), "-") || is_op(cur(), "+")) {
      ExprKind k = cur().text == "-" ? ExprKind::neg : ExprKind::pos;
      next();
      n = node(k, line);
      n->args.push_back(parse_unary(false));
      n = seal(std::move(n));
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == TokType::name) {
      ExprPtr e;
      if (t.text == "true" || t.text == "True") {
        e = node(ExprKind::constant, line);
        e->value = Value::boolean(true);
      } else if (t.text == "false" || t.text == "False") {
        e = node(ExprKind::constant, line);
        e->value = Value::boolean(false);
      } else if (t.text == "none" || t.text == "None") {
        e = node(ExprKind::constant, line);
        e->value = Value::none();
      } else {
        e = node(ExprKind::name, line);
        e->name = t.text;
        note_name(t.text);
      }
      next();
      return seal(std::move(e));
    }
    if (t.type == TokType::string) {
      std::string s = next().text;
      while (cur().type == TokType::string) s += next().text;
      auto e = node(ExprKind::constant, line);
      e->value = Value::string(std::move(s));
      return seal(std::move(e));
    }
    if (t.type == TokType::integer || t.type == TokType::floating) {
      auto e = node(ExprKind::constant, line);
      e->value = t.type == TokType::integer ? Value::integer(t.int_value) : Value::floating(t.float_value);
      next();
      return seal(std::move(e));
    }
    if (is_op(t, "(")) {
      next();
      ExprPtr e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op(t, "[")) {
      next();
      auto e = node(ExprKind::list, line);
      while (!is_op(cur(), "]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op(cur(), "]")) break;
        e->args.push_back(parse_expression(true));
      }
      expect_op("]");
      return seal(std::move(e));
    }
    if (is_op(t, "{")) {
      next();
      auto e = node(ExprKind::dict, line);
      while (!is_op(cur(), "}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op(cur(), "}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      expect_op("}");
      return seal(std::move(e));
    }
    fail_at(line, "unexpected " + desc(t));
  }

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      if (is_op(cur(), ".") || is_op(cur(), "[")) {
        n = parse_subscript(std::move(n));
      } else if (is_op(cur(), "(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (is_op(cur(), "|")) {
        n = parse_filter(std::move(n), false);
      } else if (is_name(cur(), "is")) {
        n = parse_test(std::move(n));
      } else if (is_op(cur(), "(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr n) {
    const Token& t = next();
    int line = t.line;
    if (t.text == ".") {
      const Token& a = next();
      if (a.type == TokType::name) {
        auto e = node(ExprKind::getattr, line);
        e->args.push_back(std::move(n));
        e->name = a.text;
        return seal(std::move(e));
      }
      if (a.type != TokType::integer) fail_at(a.line, "expected name or number");
      auto idx = node(ExprKind::constant, a.line);
      idx->value = Value::integer(a.int_value);
      auto e = node(ExprKind::getitem, line);
      e->args.push_back(std::move(n));
      e->args.push_back(seal(std::move(idx)));
      return seal(std::move(e));
    }
    // [
    std::vector<ExprPtr> args;
    while (!is_op(cur(), "]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    ExprPtr index;
    if (args.size() == 1) {
      index = std::move(args[0]);
    } else {
      auto tup = node(ExprKind::tuple, line);
      tup->args = std::move(args);
      index = seal(std::move(tup));
    }
    auto e = node(ExprKind::getitem, line);
    e->args.push_back(std::move(n));
    e->args.push_back(std::move(index));
    return seal(std::move(e));
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    std::vector<ExprPtr> args;
    if (is_op(cur(), ":")) {
      next();
      args.push_back(nullptr);
    } else {
      ExprPtr e = parse_expression(true);
      if (!is_op(cur(), ":")) return e;
      next();
      args.push_back(std::move(e));
    }
    if (is_op(cur(), ":")) {
      args.push_back(nullptr);
    } else if (!is_op(cur(), "]") && !is_op(cur(), ",")) {
      args.push_back(parse_expression(true));
    } else {
      args.push_back(nullptr);
    }
    if (is_op(cur(), ":")) {
      next();
      if (!is_op(cur(), "]") && !is_op(cur(), ",")) {
        args.push_back(parse_expression(true));
      } else {
        args.push_back(nullptr);
      }
    } else {
      args.push_back(nullptr);
    }
    auto s = node(ExprKind::slice, line);
    s->args = std::move(args);
    return seal(std::move(s));
  }

  void parse_call_args(Expr& e) {
    int line = cur().line;
    expect_op("(");
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail_at(line, "invalid syntax for function call expression");
    };
    while (!is_op(cur(), ")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(cur(), ")")) break;
      }
      if (is_op(cur(), "*")) {
        ensure(!e.dyn_args && !e.dyn_kwargs);
        next();
        e.dyn_args = parse_expression(true);
      } else if (is_op(cur(), "**")) {
        ensure(!e.dyn_kwargs);
        next();
        e.dyn_kwargs = parse_expression(true);
      } else if (cur().type == TokType::name && is_op(look(), "=")) {
        ensure(!e.dyn_kwargs);
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!e.dyn_args && !e.dyn_kwargs && e.kwargs.empty());
        e.call_args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr n) {
    auto e = node(ExprKind::call, cur().line);
    e->args.push_back(std::move(n));
    parse_call_args(*e);
    return seal(std::move(e));
  }

  ExprPtr parse_filter(ExprPtr n, bool start_inline) {
    while (is_op(cur(), "|") || start_inline) {
      if (!start_inline) next();
      const Token& t = expect_name();
      int line = t.line;
      std::string name = t.text;
      while (is_op(cur(), ".")) {
        next();
        name += "." + expect_name().text;
      }
      if (!find_filter(name)) fail_at(line, "no filter named '" + name + "'");
      auto e = node(ExprKind::filter, line);
      e->args.push_back(std::move(n));
      e->name = std::move(name);
      if (is_op(cur(), "(")) parse_call_args(*e);
      n = seal(std::move(e));
      start_inline = false;
    }
    return n;
  }

  ExprPtr parse_test(ExprPtr n) {
    int line = next().line;  // is
    bool negated = skip_name("not");
    std::string name = expect_name().text;
    while (is_op(cur(), ".")) {
      next();
      name += "." + expect_name().text;
    }
    if (!find_test(name)) fail_at(line, "no test named '" + name + "'");
    auto e = node(ExprKind::test, line);
    e->args.push_back(std::move(n));
    e->name = std::move(name);
    const Token& c = cur();
    if (is_op(c, "(")) {
      parse_call_args(*e);
    } else if ((c.type == TokType::name || c.type == TokType::string || c.type == TokType::integer ||
                c.type == TokType::floating || is_op(c, "(") || is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
      if (is_name(c, "is")) fail_at(c.line, "you cannot chain multiple tests with is");
      ExprPtr arg = parse_primary();
      e->call_args.push_back(parse_postfix(std::move(arg)));
    }
    ExprPtr result = seal(std::move(e));
    if (negated) {
      auto no = node(ExprKind::not_, line);
      no->args.push_back(std::move(result));
      result = seal(std::move(no));
    }
    return result;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  ParseLimits limits_;
  size_t block_depth_ = 0;
  size_t expr_depth_ = 0;
  size_t loop_depth_ = 0;
  std::vector<std::string> tag_stack_;
  std::vector<std::vector<std::string>> macro_names_;
};

}  // namespace

std::unique_ptr<ast::Program> parse(std::string_view source, const ParseLimits& limits) {
  return Parser(lex(source), limits).parse();
}

}  // namespace serval::chat_template
