// Hostile templates: every budget of ChatTemplateLimits ends a compile or a
// render with a clear Status (never a crash, hang or stack overflow), and
// the sandbox exposes nothing beyond the data passed in. The deep-nesting
// cases run on a thread with a small (1 MiB) stack to show that recursion is
// bounded well below what an HTTP worker thread has.
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/chat_template/chat_template.h"

namespace serval {
namespace {

using Clock = std::chrono::steady_clock;

// The stack the deep-nesting cases run on. Sanitizer builds have much larger
// frames, so they get more room: there the point is memory errors, not depth.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kSmallStack = 16 << 20;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr size_t kSmallStack = 16 << 20;
#else
constexpr size_t kSmallStack = 1 << 20;
#endif
#else
constexpr size_t kSmallStack = 1 << 20;
#endif

// Runs fn on a thread with a `stack_bytes` stack.
void run_with_stack(size_t stack_bytes, const std::function<void()>& fn) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, stack_bytes), 0);
  auto* heap_fn = new std::function<void()>(fn);
  pthread_t th;
  auto tramp = [](void* p) -> void* {
    auto* f = static_cast<std::function<void()>*>(p);
    (*f)();
    delete f;
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&th, &attr, tramp, heap_fn), 0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
}

struct Outcome {
  bool compiled = false;
  bool rendered = false;
  Status status;
  std::string output;
  double seconds = 0;
};

Outcome run(const std::string& src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object(),
            const ChatTemplateLimits& limits = {}) {
  Outcome o;
  auto t0 = Clock::now();
  auto t = ChatTemplate::compile(src, limits);
  if (!t.ok()) {
    o.status = t.status();
  } else {
    o.compiled = true;
    auto r = t->render(ctx);
    if (r.ok()) {
      o.rendered = true;
      o.output = *r;
    } else {
      o.status = r.status();
    }
  }
  o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return o;
}

// Time bounds are multiplied by SERVAL_TIME_SCALE (scripts/test-sanitize.sh
// sets it: the sanitized build runs several times slower).
double time_scale() {
  const char* s = std::getenv("SERVAL_TIME_SCALE");
  return s ? std::max(1.0, std::atof(s)) : 1.0;
}

// Expects a failure with `code` whose message contains `needle`, within 5 s.
void expect_fails(const std::string& name, const Outcome& o, StatusCode code, const std::string& needle) {
  EXPECT_FALSE(o.rendered) << name << ": rendered " << o.output.size() << " bytes";
  EXPECT_EQ(o.status.code(), code) << name << ": " << o.status.message();
  EXPECT_NE(o.status.message().find(needle), std::string::npos)
      << name << ": message '" << o.status.message() << "' lacks '" << needle << "'";
  EXPECT_LT(o.seconds, 5.0 * time_scale()) << name << " took " << o.seconds << " s";
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

TEST(ChatTemplateSandbox, LoopBudgets) {
  expect_fails("nested huge loops",
               run("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
               StatusCode::resource_exhausted, "iterations");
  expect_fails("range too big", run("{% for i in range(1000000000) %}{% endfor %}"), StatusCode::resource_exhausted,
               "Range too big");
  expect_fails("many loops over a list", run("{% for i in range(1000) %}{% for c in lst %}{% endfor %}{% endfor %}",
                                             {{"lst", std::vector<int>(1000, 1)}}),
               StatusCode::resource_exhausted, "iterations");
  expect_fails("recursive loop", run("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}"),
               StatusCode::resource_exhausted, "recursion");
  expect_fails("iterating a huge string", run("{% for c in s %}{% endfor %}", {{"s", std::string(200000, 'x')}}),
               StatusCode::resource_exhausted, "iterating a string");
  expect_fails("listing a huge string", run("{{ (s|list)|length }}", {{"s", std::string(200000, 'x')}}),
               StatusCode::resource_exhausted, "iterating a string");
}

TEST(ChatTemplateSandbox, RecursionBudgets) {
  expect_fails("infinite macro recursion", run("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
               StatusCode::resource_exhausted, "macro recursion");
  expect_fails("mutual recursion",
               run("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}"),
               StatusCode::resource_exhausted, "macro recursion");
  // Legitimate recursion below the limit works.
  Outcome ok = run("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(50) }}");
  EXPECT_TRUE(ok.rendered) << ok.status.message();
  // Recursion from inside deep expressions hits the evaluation-depth bound
  // (60 calls x 200 levels), not the C++ stack.
  std::string deep = "f(n + 1)|length" + repeat(" + 1", 200);
  expect_fails("deep expression x deep recursion",
               run("{% macro f(n) %}{% if n < 60 %}{{ " + deep + " }}{% endif %}{% endmacro %}{{ f(0) }}"),
               StatusCode::resource_exhausted, "nested deeper");
}

TEST(ChatTemplateSandbox, NestingBudgetsOnSmallStack) {
  run_with_stack(kSmallStack, [] {
    const size_t n = 100000;
    ChatTemplateLimits big_source;
    big_source.max_source_bytes = 64 << 20;
    auto run = [&](const std::string& src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
      return ::serval::run(src, ctx, big_source);
    };
    expect_fails("nested ifs", run(repeat("{% if true %}", n) + "x" + repeat("{% endif %}", n)),
                 StatusCode::resource_exhausted, "nested");
    expect_fails("nested parens", run("{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}"),
                 StatusCode::resource_exhausted, "nested");
    expect_fails("nested lists", run("{{ " + repeat("[", n) + repeat("]", n) + " }}"), StatusCode::resource_exhausted,
                 "nested");
    expect_fails("nested dicts", run("{{ " + repeat("{'a': ", n) + "1" + repeat("}", n) + " }}"),
                 StatusCode::resource_exhausted, "nested");
    expect_fails("unary chain", run("{{ " + repeat("-", n) + "1 }}"), StatusCode::resource_exhausted, "nested");
    expect_fails("not chain", run("{{ " + repeat("not ", n) + "1 }}"), StatusCode::resource_exhausted, "nested");
    expect_fails("filter chain", run("{{ 'x'" + repeat("|upper", n) + " }}"), StatusCode::resource_exhausted,
                 "nested");
    expect_fails("attribute chain", run("{{ x" + repeat(".a", n) + " }}"), StatusCode::resource_exhausted, "nested");
    expect_fails("addition chain", run("{{ 1" + repeat(" + 1", n) + " }}"), StatusCode::resource_exhausted,
                 "nested");
    expect_fails("call chain", run("{{ f" + repeat("()", n) + " }}"), StatusCode::resource_exhausted, "nested");
    expect_fails("conditional chain", run("{{ 1" + repeat(" if 1 else 2", n) + " }}"),
                 StatusCode::resource_exhausted, "nested");
    expect_fails("nested macros", run(repeat("{% macro m() %}", n) + repeat("{% endmacro %}", n)),
                 StatusCode::resource_exhausted, "nested");
    // A deep but legal context value, and one past the limit.
    nlohmann::ordered_json deep = 1;
    for (int i = 0; i < 100; ++i) deep = nlohmann::ordered_json::array({deep});
    Outcome ok = run("{{ v|tojson|length }}{{ v }}", {{"v", deep}});
    EXPECT_TRUE(ok.rendered) << ok.status.message();
    nlohmann::ordered_json deeper = nlohmann::ordered_json::parse(repeat("[", 10000) + "1" + repeat("]", 10000));
    // Moved in, not copied: json's copy constructor recurses once per level,
    // and in this test's own (less optimized) code 10000 frames of it
    // overflowed the small stack before the template engine was reached.
    nlohmann::ordered_json deep_ctx = nlohmann::ordered_json::object();
    deep_ctx["v"] = std::move(deeper);
    expect_fails("deep context", run("{{ v }}", deep_ctx), StatusCode::resource_exhausted, "nested");
    // Values built by the template are bounded the same way.
    expect_fails("deep list built in a loop",
                 run("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}"),
                 StatusCode::resource_exhausted, "nesting");
    expect_fails("chain of bound methods",
                 run("{% set ns = namespace(v=none) %}{% for i in range(1000) %}{% set ns.v = {'a': ns.v}.get %}"
                     "{% endfor %}{{ [ns.v] }}"),
                 StatusCode::resource_exhausted, "nesting");
    // A long chain of namespaces: printing it is bounded; destroying it does not recurse.
    Outcome chain = run("{% set ns = namespace(v=none) %}{% for i in range(50000) %}{% set ns.v = namespace(v=ns.v) %}"
                        "{% endfor %}{{ ns }}");
    EXPECT_FALSE(chain.rendered);
    EXPECT_NE(chain.status.message().find("too deep"), std::string::npos) << chain.status.message();
    Outcome quiet = run("{% set ns = namespace(v=none) %}{% for i in range(50000) %}{% set ns.v = namespace(v=ns.v) %}"
                        "{% endfor %}done");
    EXPECT_EQ(quiet.output, "done") << quiet.status.message();
  });
}

TEST(ChatTemplateSandbox, OutputAndMemoryBudgets) {
  expect_fails("output bomb", run("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"),
               StatusCode::resource_exhausted, "output exceeds");
  expect_fails("one huge string", run("{{ 'x' * 1000000000 }}"), StatusCode::resource_exhausted, "string longer");
  expect_fails("string doubling",
               run("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
               StatusCode::resource_exhausted, "string longer");
  expect_fails("huge list", run("{{ ([0] * 1000000000)|length }}"), StatusCode::resource_exhausted, "items");
  expect_fails("list doubling",
               run("{% set ns = namespace(l=[0]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"),
               StatusCode::resource_exhausted, "");
  expect_fails("quadratic list growth",
               run("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}"),
               StatusCode::resource_exhausted, "");
  expect_fails("replace bomb", run("{{ ('x' * 1000000)|replace('x', 'yyyyyyyyyy') }}"), StatusCode::resource_exhausted,
               "string longer");
  expect_fails("join bomb", run("{{ (['x' * 1000000] * 100)|join }}"), StatusCode::resource_exhausted,
               "string longer");
  expect_fails("indent bomb", run("{{ ('\\n' * 1000000)|indent(100, blank=true) }}"), StatusCode::resource_exhausted,
               "string longer");
  expect_fails("center bomb", run("{{ 'x'|center(1000000000) }}"), StatusCode::resource_exhausted, "string longer");
  expect_fails("format bomb", run("{{ '%1000000000s' % 'x' }}"), StatusCode::resource_exhausted, "too large");
  expect_fails("tojson bomb", run("{{ ([[[1, 2, 3, 4]] * 1000] * 1000)|tojson(indent=100) }}"),
               StatusCode::resource_exhausted, "");
  ChatTemplateLimits small;
  small.max_output_bytes = 1000;
  expect_fails("custom output limit", run("{{ 'x' * 2000 }}", nlohmann::ordered_json::object(), small), StatusCode::resource_exhausted,
               "1000 bytes");
}

TEST(ChatTemplateSandbox, StepBudget) {
  ChatTemplateLimits limits;
  limits.max_steps = 100000;
  expect_fails("steps", run("{% for i in range(100000) %}{{ i + i + i + i }}{% endfor %}", nlohmann::ordered_json::object(), limits),
               StatusCode::resource_exhausted, "steps");
  // The default budget stops a pathological-but-loop-bounded template quickly.
  Outcome o = run("{% for i in range(100000) %}{% set x = (lst|map('string')|list|join)|length %}{% endfor %}",
                  {{"lst", std::vector<int>(1000, 7)}});
  EXPECT_FALSE(o.rendered);
  EXPECT_EQ(o.status.code(), StatusCode::resource_exhausted) << o.status.message();
  EXPECT_LT(o.seconds, 10.0 * time_scale());
}

TEST(ChatTemplateSandbox, SourceSizeLimit) {
  std::string big(300 * 1024, 'x');
  expect_fails("source too big", run(big), StatusCode::resource_exhausted, "source is");
  ChatTemplateLimits limits;
  limits.max_source_bytes = 10;
  expect_fails("custom source limit", run("{{ 'hello' }}", nlohmann::ordered_json::object(), limits), StatusCode::resource_exhausted, "limit");
}

TEST(ChatTemplateSandbox, NoAccessBeyondData) {
  nlohmann::ordered_json ctx = {{"messages", nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}})},
                                {"s", "str"}};
  // Python-internal attributes are undefined (print as nothing), as in jinja2's sandbox...
  const char* const blank[] = {
      "{{ ''.__class__ }}",     "{{ s.__class__ }}",       "{{ messages.__class__ }}", "{{ messages[0].__dict__ }}",
      "{{ range.__globals__ }}", "{{ namespace.__init__ }}", "{{ self }}",               "{{ config }}",
      "{{ request }}",           "{{ os }}",                "{{ __builtins__ }}",       "{{ lipsum }}",
      "{{ [].append }}",         "{{ s['__class__'] }}",    "{{ cycler.__name__ }}",    "{{ loop }}",
  };
  for (const char* src : blank) {
    Outcome o = run(src, ctx);
    EXPECT_TRUE(o.rendered) << src << ": " << o.status.message();
    EXPECT_EQ(o.output, "") << src;
  }
  // ...and anything done with them is an error.
  const char* const errors[] = {
      "{{ ''.__class__.__mro__[1].__subclasses__() }}",
      "{{ s.__class__.__base__ }}",
      "{{ range.__globals__['os'] }}",
      "{{ messages.__class__() }}",
      "{{ [].append(1) }}",
      "{{ messages.append(1) }}",
      "{{ messages.pop() }}",
      "{{ messages[0].update({'role': 'system'}) }}",
      "{{ messages[0].clear() }}",
      "{{ lipsum() }}",
      "{{ self.__init__.__globals__ }}",
      "{% include '/etc/passwd' %}",
      "{% import 'os' as os %}",
      "{% extends '/etc/passwd' %}",
  };
  for (const char* src : errors) {
    Outcome o = run(src, ctx);
    EXPECT_FALSE(o.rendered) << src << " rendered: " << o.output;
    EXPECT_NE(o.status.code(), StatusCode::internal) << src;
  }
  // The context is never modified by a render.
  auto t = ChatTemplate::compile("{% set messages = [] %}{% set ns = namespace(m=messages) %}{{ messages|length }}");
  ASSERT_TRUE(t.ok());
  nlohmann::ordered_json before = ctx;
  auto r = t->render(ctx);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "0");
  EXPECT_EQ(ctx, before);
}

TEST(ChatTemplateSandbox, SyntaxErrorsNameTheProblemAndLine) {
  struct Case {
    const char* src;
    const char* needle;
    int line;
  };
  const Case cases[] = {
      {"line1\nline2\n{{ x", "end of template", 3},
      {"a\n{% if true %}\nb", "'if' block is not closed", 3},
      {"{# never closed", "comment", 1},
      {"\n\n{% raw %} no end", "raw", 3},
      {"{{ 'abc }}", "unexpected char", 1},
      {"x\n{{ (1, 2 }}", "unexpected '}'", 2},
      {"\n{% for x in %}{% endfor %}", "expected an expression", 2},
      {"{% endif %}", "unknown tag 'endif'", 1},
      {"\n\n\n{{ x|bogus }}", "no filter named 'bogus'", 4},
      {"{{ x is bogus }}", "no test named 'bogus'", 1},
      {"{% macro m(a=1, b) %}{% endmacro %}", "non-default argument", 1},
      {"{% break %}", "outside of a loop", 1},
      {"{{ '\\x4' }}", "truncated", 1},
      {"{{ 99999999999999999999 }}", "too large", 1},
  };
  for (const auto& c : cases) {
    auto t = ChatTemplate::compile(c.src);
    ASSERT_FALSE(t.ok()) << c.src;
    EXPECT_EQ(t.status().code(), StatusCode::invalid_argument) << c.src;
    const std::string& m = t.status().message();
    EXPECT_NE(m.find(c.needle), std::string::npos) << c.src << " -> " << m;
    EXPECT_NE(m.find("line " + std::to_string(c.line) + ":"), std::string::npos) << c.src << " -> " << m;
  }
}

TEST(ChatTemplateSandbox, RuntimeErrorsNameTheProblemAndLine) {
  auto t = ChatTemplate::compile(
      "{%- for m in messages %}\n"
      "{%- if m.role not in ['user', 'assistant'] %}\n"
      "{{- raise_exception('Unsupported role: ' ~ m.role) }}\n"
      "{%- endif %}\n"
      "{%- endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  nlohmann::ordered_json ctx = {{"messages", nlohmann::ordered_json::array({{{"role", "robot"}, {"content", ""}}})}};
  auto r = t->render(ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("Unsupported role: robot"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status().message();

  auto u = ChatTemplate::compile("ok\n{{ messages[0].content.missing.deeper }}");
  ASSERT_TRUE(u.ok());
  auto ru = u->render(ctx);
  ASSERT_FALSE(ru.ok());
  EXPECT_NE(ru.status().message().find("has no attribute 'missing'"), std::string::npos) << ru.status().message();
  EXPECT_NE(ru.status().message().find("line 2"), std::string::npos) << ru.status().message();
}

TEST(ChatTemplateSandbox, SelfReferenceAndCycles) {
  // Namespaces are the only mutable values; self-references print like Python and do not leak.
  Outcome o = run("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}");
  EXPECT_TRUE(o.rendered) << o.status.message();
  EXPECT_EQ(o.output, "<Namespace {'a': 1, 'self': <Namespace {...}>}>");
  Outcome o2 = run("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = [b] %}{{ a.b[0].a.b|length }}");
  EXPECT_EQ(o2.output, "1") << o2.status.message();
}

TEST(ChatTemplateSandbox, GarbageInputNeverCrashes) {
  // Byte soup built from template syntax fragments: compile (and render what compiles) without crashing.
  const char* const frags[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", "if", "for", "x", "in", "(", ")",
                               "[", "]", "{", "}", "'", "\"", "|", ".", ",", "endif", "endfor", " ", "\n", "1",
                               "raw", "endraw", "set", "=", "macro", "endmacro", "~", "is", "not", "\\", "\xff", "é"};
  const size_t nf = sizeof(frags) / sizeof(frags[0]);
  uint64_t state = 12345;
  auto next = [&]() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  run_with_stack(kSmallStack, [&] {
    for (int i = 0; i < 3000; ++i) {
      std::string src;
      size_t len = next() % 40;
      for (size_t k = 0; k < len; ++k) src += frags[next() % nf];
      auto t = ChatTemplate::compile(src);
      if (t.ok()) {
        auto r = t->render(nlohmann::ordered_json{{"x", nlohmann::ordered_json::array({1, 2})}});
        if (!r.ok()) {
          EXPECT_NE(r.status().code(), StatusCode::internal) << src << ": " << r.status().message();
        }
      } else {
        EXPECT_NE(t.status().code(), StatusCode::internal) << src << ": " << t.status().message();
      }
    }
  });
}

}  // namespace
}  // namespace serval
