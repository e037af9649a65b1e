#!/usr/bin/env python3
"""Structured output end to end on stories260K: JSON Schema outputs sampled at
temperature 1.0 must all parse and validate (Debian's python3-jsonschema is
the independent validator), json_object / regex / choice / GBNF constrain the
text, tool calls come back as OpenAI tool_calls (streaming and not), and the
abuse cases (deep nesting, huge repetitions, left recursion, $ref cycles,
minItems 100000, unknown keywords, unsatisfiable schemas) each get a fast 400
naming the problem."""

import contextlib
import json
import os
import re
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, check_error_body, eq, post, short, stream  # noqa: E402

import jsonschema  # noqa: E402  (python3-jsonschema)

suite = Suite("server_structured_output")
C, H = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "Tell me about a cat."}]

# Bounded schemas (strings have maxLength, arrays maxItems), so every output
# ends well within max_tokens and "100% valid" is a fair requirement.
SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                       "happy": {"type": "boolean"}},
        "required": ["name", "age", "happy"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "pet": {"type": "object",
                    "properties": {"kind": {"enum": ["cat", "dog", "bird"]},
                                   "legs": {"type": "integer"},
                                   "owner": {"type": "object",
                                             "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 8}},
                                             "required": ["name"]}},
                    "required": ["kind", "owner"]},
            "score": {"type": "number"},
        },
        "required": ["pet"],
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}]},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
        },
        "required": ["tags", "pair", "maybe"],
    },
    "enum_root": {"enum": ["red", "green", 3, None, {"a": [1, 2]}]},
    "refs": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                            "required": ["x", "y"]}},
        "type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2,
    },
    "formats": {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"},
                       "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2,3}$"},
                       "id": {"type": "string", "format": "uuid"}},
        "required": ["day", "code", "id"],
    },
}


class Ctx:
    port = None


@suite.setup
@contextlib.contextmanager
def setup():
    with Server(name="structured") as srv:
        ctx = Ctx()
        ctx.port = srv.port
        yield ctx


def ok(ctx, path, body):
    r = post(ctx.port, path, body, timeout=120)
    eq(r.status, 200, f"POST {path} {short(body, 300)} status ({short(r.body, 300)})")
    return r.json()


def validate(schema, text, what):
    try:
        value = json.loads(text)
    except ValueError as e:
        raise AssertionError(f"{what}: output is not JSON ({e}): {text!r}")
    try:
        jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as e:
        raise AssertionError(f"{what}: output does not validate ({e.message}): {text!r}")


@suite.test
def json_schema_outputs_all_validate(ctx):
    total = 0
    for name, schema in SCHEMAS.items():
        for path in (C, H):
            body = {"max_tokens": 400, "temperature": 1.0, "n": 4, "seed": 1234,
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": name, "schema": schema, "strict": True}}}
            body.update({"prompt": "Once upon a time"} if path == C else {"messages": MSG})
            j = ok(ctx, path, body)
            eq(len(j["choices"]), 4, f"{name}: choices")
            for c in j["choices"]:
                text = c["text"] if path == C else c["message"]["content"]
                eq(c["finish_reason"], "stop", f"{name} {path}: finish_reason (text {text!r})")
                validate(schema, text, f"{name} {path}")
                total += 1
    eq(total, len(SCHEMAS) * 2 * 4, "validated outputs")


@suite.test
def json_schema_streaming_validates(ctx):
    schema = SCHEMAS["nested"]
    s = stream(ctx.port, H, {"messages": MSG, "max_tokens": 400, "temperature": 1.0, "stream": True,
                             "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
    eq(s.status, 200, "status")
    s.check_well_formed("stream")
    validate(schema, s.text(chat=True), "streamed")


def json_prefix_ok(text):
    """True iff `text` is a prefix of some JSON text (a small independent
    state machine; numbers are checked leniently)."""
    stack = []          # '{' or '['
    expect = "value"    # value | key | key_or_end | colon | comma_or_end | value_or_end | done
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\n\r":
            i += 1
            continue
        if expect in ("value", "value_or_end", "key", "key_or_end"):
            if expect.endswith("_or_end") and ch == ("}" if expect == "key_or_end" else "]"):
                stack.pop()
                expect = "comma_or_end" if stack else "done"
                i += 1
                continue
            if ch == '"':
                j = i + 1
                while j < n and text[j] != '"':
                    if text[j] == "\\":
                        if j + 1 < n and text[j + 1] == "u":
                            if not re.fullmatch(r"[0-9a-fA-F]{0,4}", text[j + 2:j + 6]):
                                return False
                            j += 6
                            continue
                        if j + 1 < n and text[j + 1] not in '"\\/bfnrt':
                            return False
                        j += 2
                        continue
                    if ord(text[j]) < 0x20:
                        return False
                    j += 1
                if j >= n:
                    return True  # inside a string
                i = j + 1
                expect = "colon" if expect.startswith("key") else ("comma_or_end" if stack else "done")
                continue
            if expect.startswith("key"):
                return False
            if ch in "{[":
                stack.append(ch)
                expect = "key_or_end" if ch == "{" else "value_or_end"
                i += 1
                continue
            m = re.match(r"-?[0-9.eE+-]*", text[i:])
            if m and m.group(0):
                i += len(m.group(0))
                expect = "comma_or_end" if stack else "done"
                continue
            for lit in ("true", "false", "null"):
                part = text[i:i + len(lit)]
                if lit.startswith(part):
                    if len(part) < len(lit):
                        return i + len(part) == n
                    i += len(lit)
                    expect = "comma_or_end" if stack else "done"
                    break
            else:
                return False
            continue
        if expect == "colon":
            if ch != ":":
                return False
            expect = "value"
        elif expect == "comma_or_end":
            if ch == ",":
                expect = "key" if stack[-1] == "{" else "value"
            elif ch == ("}" if stack[-1] == "{" else "]"):
                stack.pop()
                expect = "comma_or_end" if stack else "done"
            else:
                return False
        else:
            return False  # text after the end
        i += 1
    return True


@suite.test
def json_object_is_an_object(ctx):
    check(json_prefix_ok('{"a": [1, {"b": "x\\u00') and not json_prefix_ok('{"a" 1') and
          not json_prefix_ok('{1: 2}') and not json_prefix_ok('{}}'), "json_prefix_ok self-check")
    j = ok(ctx, C, {"prompt": "Once upon a time", "max_tokens": 100, "temperature": 1.0, "n": 6, "seed": 7,
                    "response_format": {"type": "json_object"}})
    for c in j["choices"]:
        text = c["text"]
        check(text.startswith("{"), f"json_object output must start with '{{': {text!r}")
        if c["finish_reason"] == "stop":
            check(isinstance(json.loads(text), dict), f"not an object: {text!r}")
        else:  # cut by max_tokens: still a prefix of an object
            check(json_prefix_ok(text), f"not a JSON prefix: {text!r}")


@suite.test
def regex_choice_and_grammar(ctx):
    j = ok(ctx, C, {"prompt": "Once", "max_tokens": 40, "temperature": 1.0, "n": 4, "regex": r"[0-9]{3}-(ab|cd){1,3}x?"})
    for c in j["choices"]:
        eq(c["finish_reason"], "stop", f"regex finish ({c['text']!r})")
        check(re.fullmatch(r"[0-9]{3}-(ab|cd){1,3}x?", c["text"]), f"regex: {c['text']!r}")
    j = ok(ctx, H, {"messages": MSG, "max_tokens": 20, "temperature": 1.0, "n": 4, "choice": ["yes", "no", "maybe"]})
    for c in j["choices"]:
        check(c["message"]["content"] in ("yes", "no", "maybe"), f"choice: {c['message']['content']!r}")
    g = 'root ::= "A" [a-c]{2,4} ("!" | "?")\n'
    j = ok(ctx, C, {"prompt": "Once", "max_tokens": 20, "temperature": 1.0, "n": 4, "grammar": g})
    for c in j["choices"]:
        check(re.fullmatch(r"A[a-c]{2,4}[!?]", c["text"]), f"grammar: {c['text']!r}")


# Python regexes for shared grammars whose language is regular (whole outputs).
SHARED_CHECKS = {
    "list.gbnf": lambda t: re.fullmatch(r"(- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+", t),
    "json.gbnf": lambda t: isinstance(json.loads(t), dict),
    "json_arr.gbnf": lambda t: isinstance(json.loads(t), list),
}


@suite.test
def every_shared_grammar_constrains_generation(ctx):
    gdir = os.path.join(Config.shared, "grammars")
    files = sorted(f for f in os.listdir(gdir) if f.endswith(".gbnf"))
    check(len(files) >= 8, f"shared grammars: {files}")
    for f in files:
        with open(os.path.join(gdir, f)) as fh:
            g = fh.read()
        j = ok(ctx, C, {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 1.0, "n": 2, "seed": 3,
                        "grammar": g})
        for c in j["choices"]:
            check(c["text"] != "", f"{f}: empty output")
            if c["finish_reason"] == "stop" and f in SHARED_CHECKS:
                check(SHARED_CHECKS[f](c["text"]), f"{f}: {c['text']!r}")


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object",
                                                     "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                                    "days": {"type": "integer"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]


def check_tool_call(tc, what, names=("get_weather", "add")):
    check(isinstance(tc.get("id"), str) and tc["id"], f"{what}: id")
    eq(tc.get("type"), "function", f"{what}: type")
    fn = tc["function"]
    check(fn["name"] in names, f"{what}: name {fn['name']!r}")
    args = json.loads(fn["arguments"])
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == fn["name"])
    jsonschema.validate(args, schema)


@suite.test
def tool_calls_non_streaming(ctx):
    j = ok(ctx, H, {"messages": MSG, "tools": TOOLS, "tool_choice": "required", "max_tokens": 200,
                    "temperature": 1.0, "n": 3})
    for c in j["choices"]:
        eq(c["finish_reason"], "tool_calls", "finish_reason")
        check(c["message"]["content"] is None, "content must be null with tool_calls")
        eq(len(c["message"]["tool_calls"]), 1, "one call")
        check_tool_call(c["message"]["tool_calls"][0], "required")
    j = ok(ctx, H, {"messages": MSG, "tools": TOOLS, "max_tokens": 200, "temperature": 1.0,
                    "tool_choice": {"type": "function", "function": {"name": "add"}}})
    c = j["choices"][0]
    eq(c["finish_reason"], "tool_calls", "named: finish_reason")
    check_tool_call(c["message"]["tool_calls"][0], "named", names=("add",))
    # auto: text or a call; a call must be valid.
    j = ok(ctx, H, {"messages": MSG, "tools": TOOLS, "max_tokens": 30, "temperature": 1.0, "n": 4})
    for c in j["choices"]:
        if c["finish_reason"] == "tool_calls":
            check_tool_call(c["message"]["tool_calls"][0], "auto")
        else:
            check(not (c["message"]["content"] or "").startswith("{"), f"auto text: {c['message']}")
    # none: plain text, no tool_calls.
    j = ok(ctx, H, {"messages": MSG, "tools": TOOLS, "tool_choice": "none", "max_tokens": 8, "temperature": 0})
    check("tool_calls" not in j["choices"][0]["message"], "tool_choice none")


@suite.test
def tool_calls_streaming(ctx):
    s = stream(ctx.port, H, {"messages": MSG, "tools": TOOLS, "tool_choice": "required", "max_tokens": 200,
                             "temperature": 1.0, "stream": True})
    eq(s.status, 200, "status")
    s.check_well_formed("tool stream")
    calls = []
    for ev in s.events:
        for ch in ev.get("choices", []):
            calls += ch.get("delta", {}).get("tool_calls", [])
    eq(len(calls), 1, f"delta.tool_calls in {short(s.events, 800)}")
    eq(calls[0]["index"], 0, "tool call index")
    check_tool_call(calls[0], "stream")
    eq(s.finish_reason(), ["tool_calls"], "stream finish_reason")


@suite.test
def abuse_gets_fast_400(ctx):
    deep_gbnf = "root ::= " + "(" * 60000 + '"a"' + ")" * 60000 + "\n"
    deep_schema_body = '{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": ' + \
        '{"type": "array", "items": ' * 60000 + "{}" + "}" * 60000 + "}}}"
    cases = [
        ("deep gbnf", {"grammar": deep_gbnf}, "grammar", "nesting"),
        ("huge repetition", {"grammar": 'root ::= "a"{0,100000000}'}, "grammar", "repetition"),
        ("left recursion", {"grammar": 'root ::= expr\nexpr ::= expr "+" "1" | "1"\n'}, "grammar", "left-recursive"),
        ("malformed", {"grammar": 'root ::= "a" )'}, "grammar", "unexpected character"),
        ("undefined rule", {"grammar": "root ::= nope"}, "grammar", "not defined"),
        ("ref cycle", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "c", "schema": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                    "$ref": "#/$defs/a"}}}}, "response_format", "refers to itself in place"),
        ("minItems 100000", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "m", "schema": {"type": "array", "minItems": 100000}}}}, "response_format", "'minItems'"),
        ("huge regex", {"regex": "a{99999999}"}, "regex", "repetition"),
        ("two constraints", {"regex": "a", "choice": ["a"]}, "choice", "only one"),
        ("unsupported keyword", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "k", "schema": {"type": "integer", "minimun": 1}}}}, "response_format", "keyword 'minimun'"),
        ("unsatisfiable", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "u", "schema": {"oneOf": [True, True]}}}}, "response_format", "keyword 'oneOf'"),
        ("bad tool_choice", {"messages": MSG, "tools": TOOLS, "tool_choice": {"type": "function",
                                                                              "function": {"name": "nope"}}},
         "tool_choice", "nope"),
        # A non-string "type" (a fuzz finding: it threw inside the parser).
        ("tool type object", {"messages": MSG, "tools": [{"type": {"name": "f"}, "function": {"name": "f"}}]},
         "tools", "each tool"),
        ("tool_choice type object", {"messages": MSG, "tools": TOOLS, "tool_choice": {"type": {},
                                                                                      "function": {"name": "add"}}},
         "tool_choice", "tool_choice"),
    ]
    for what, extra, param, needle in cases:
        body = dict({"prompt": "x", "max_tokens": 4}, **extra)
        path = H if "messages" in body else C
        if path == H:
            body.pop("prompt")
        t0 = time.monotonic()
        r = post(ctx.port, path, body, timeout=30)
        dt = time.monotonic() - t0
        check_error_body(r, 400, what, param=param)
        if needle:
            check(needle in r.json()["error"]["message"], f"{what}: message {r.json()['error']['message']!r}")
        check(dt < 5.0, f"{what}: took {dt:.1f} s")
    t0 = time.monotonic()
    r = post(ctx.port, C, deep_schema_body, timeout=30)
    check_error_body(r, 400, "deep schema")
    check(time.monotonic() - t0 < 5.0, "deep schema: slow")
    # The server still serves constrained requests afterwards.
    j = ok(ctx, C, {"prompt": "Once", "max_tokens": 10, "choice": ["ok"]})
    eq(j["choices"][0]["text"], "ok", "after abuse")


if __name__ == "__main__":
    raise SystemExit(suite.main())
