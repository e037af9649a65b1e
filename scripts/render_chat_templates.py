#!/usr/bin/env python3
"""Reference renderer for serval's chat-template tests.

Renders Jinja chat templates with Python's jinja2 configured exactly as
Hugging Face transformers does in apply_chat_template
(ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, the
loopcontrols extension, the `generation` tag, HF's tojson filter and the
raise_exception / strftime_now globals), so that tests/chat_template can check
serval's own renderer against an independent implementation at test time.

Usage:
  render_chat_templates.py [--templates DIR]
      Renders every DIR/*.jinja (default ../../shared/chat-templates next to
      this checkout) with every built-in conversation below.
  render_chat_templates.py --cases FILE
      FILE holds a JSON array of {"template": source, "context": {...}};
      renders each one.

Output (stdout, ASCII JSON):
  {"jinja2_version": "...", "now_unix_seconds": N,
   "conversations": [{"name": ..., "context": {...}}, ...],       (templates mode)
   "templates": [{"name": ..., "source": ...}, ...],               (templates mode)
   "results": [{"template": i, "conversation": j, "output": "..."} or
               {..., "error": "ExceptionType: message"}, ...]}
In --cases mode each result is {"case": i, "output"/"error": ...}.

strftime_now() formats the fixed instant now_unix_seconds (UTC), so the C++
side can pass the same instant. Exit status 3 when jinja2 is missing.
"""
import argparse
import datetime
import json
import os
import sys

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:  # pragma: no cover
    sys.stderr.write("render_chat_templates.py: python3-jinja2 is not installed\n")
    sys.exit(3)

# 2024-07-26 12:34:56 UTC
NOW_UNIX_SECONDS = 1721997296


class GenerationTag(jinja2.ext.Extension):
    """HF's AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' override: no HTML escaping, json.dumps options exposed.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(NOW_UNIX_SECONDS, datetime.timezone.utc).strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "The temperature unit"},
                "days": {"type": "integer", "description": "Forecast days", "minimum": 1, "maximum": 14, "default": 1},
            },
            "required": ["location"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web for pages that match a query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Query text"},
                "filters": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Optional filters",
                    "examples": [["news"], ["images", "recent"]],
                },
                "limit": {"type": "number", "default": 10.0, "nullable": True, "description": "Max results"},
                "options": {
                    "type": "object",
                    "properties": {"safe": {"type": "boolean", "description": "Safe search"}},
                    "description": "Options",
                },
                "lang": {"type": ["string", "null"], "description": "Language code"},
            },
            "required": ["query", "options"],
        },
    },
}

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Runs Python code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code"}}},
    },
}


def conversations():
    sys_msg = {"role": "system", "content": "You are a helpful assistant."}
    convs = []

    def add(name, messages, add_generation_prompt=True, hf_keys=True, **extra):
        # Like transformers' apply_chat_template: tools and documents are always
        # passed (None when absent), plus the special tokens.
        ctx = {"messages": messages}
        if hf_keys:
            ctx["tools"] = None
            ctx["documents"] = None
        ctx.update({"add_generation_prompt": add_generation_prompt, "bos_token": "<s>", "eos_token": "</s>"})
        ctx.update(extra)
        convs.append({"name": name, "context": ctx})

    add("system_user", [sys_msg, {"role": "user", "content": "What is the capital of France?"}])
    add("user_only_no_prompt", [{"role": "user", "content": "Hello!"}], add_generation_prompt=False, hf_keys=False)
    add("multi_turn", [
        sys_msg,
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am an assistant."},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road? To get to the other side."},
        {"role": "user", "content": "Another one, please."},
    ])
    add("assistant_last_no_tools_key", [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi!"},
    ], add_generation_prompt=False, hf_keys=False)
    add("tool_calls_objects", [
        sys_msg,
        {"role": "user", "content": "What's the weather like in Paris today?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_current_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}},
        ]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_current_weather",
         "content": "{\"temperature\": 22, \"condition\": \"sunny\"}"},
        {"role": "assistant", "content": "It is 22 degrees and sunny in Paris."},
    ], tools=[WEATHER_TOOL, SEARCH_TOOL])
    add("tool_calls_strings", [
        {"role": "user", "content": "Weather in Paris and in Berlin?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "callAAAAA", "type": "function",
             "function": {"name": "get_current_weather", "arguments": "{\"location\": \"Paris\"}"}},
            {"id": "callBBBBB", "type": "function",
             "function": {"name": "get_current_weather", "arguments": "{\"location\": \"Berlin\", \"days\": 2}"}},
        ]},
        {"role": "tool", "tool_call_id": "callAAAAA", "content": "18C, cloudy"},
        {"role": "tool", "tool_call_id": "callBBBBB", "content": "12C, rain"},
        {"role": "user", "content": "Thanks. Which is warmer?"},
    ], tools=[WEATHER_TOOL])
    add("single_string_call", [
        {"role": "user", "content": "Run print(1+1)"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "callPY001", "type": "function",
             "function": {"name": "python", "arguments": "print(1+1)"}},
        ]},
        {"role": "tool", "tool_call_id": "callPY001", "content": "2"},
    ], tools=[PYTHON_TOOL, SEARCH_TOOL])
    add("unicode", [
        {"role": "system", "content": "Tu es un assistant \U0001F916 \u2014 r\u00e9ponds en fran\u00e7ais."},
        {"role": "user", "content": "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, emoji \U0001F600, quotes \"'\\ <b>&amp;</b>\ttab\n newline \u00a0nbsp"},
        {"role": "assistant", "content": "\u00c7a va! \U0001F44D \u2028line sep"},
        {"role": "user", "content": "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0627\u0644\u0639\u0631\u0628\u064a\u0629"},
    ], hf_keys=False)
    add("empty_content", [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "   "},
    ], hf_keys=False)
    add("whitespace_content", [
        {"role": "system", "content": "\n  Be brief.  \n"},
        {"role": "user", "content": "  \n hello \n\n"},
    ], add_generation_prompt=False)
    add("think", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n2 + 2 = 4."},
        {"role": "user", "content": "And 3+3?"},
    ], hf_keys=False)
    add("extras", [
        {"role": "system", "content": "Use the documents."},
        {"role": "user", "content": "Summarize the documents."},
    ], tools=[SEARCH_TOOL], documents=[
        {"title": "Doc A", "text": "Alpha is the first letter."},
        {"title": "Doc B", "text": "Beta follows alpha."},
    ], date_string="01 Jan 2025", builtin_tools=["brave_search", "wolfram_alpha"], tools_in_user_message=False,
        functions="[]", datetime="2025-01-01", enable_citations=True)
    add("empty_messages", [])
    add("system_only", [sys_msg], hf_keys=False)
    return convs


def render_one(env, source, context, cache=None):
    try:
        template = cache.get(source) if cache is not None else None
        if template is None:
            template = env.from_string(source)
            if cache is not None:
                cache[source] = template
        return {"output": template.render(**context)}
    except Exception as e:  # noqa: BLE001 -- any failure is a result to compare
        return {"error": f"{type(e).__name__}: {e}"}


def default_template_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "shared", "chat-templates"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--templates", default=None, help="directory of *.jinja templates")
    ap.add_argument("--cases", default=None, help="JSON file of {template, context} cases")
    args = ap.parse_args()
    env = make_environment()
    out = {"jinja2_version": jinja2.__version__, "now_unix_seconds": NOW_UNIX_SECONDS}
    if args.cases:
        with open(args.cases, encoding="utf-8") as f:
            cases = json.load(f)
        out["results"] = []
        for i, case in enumerate(cases):
            r = render_one(env, case["template"], case.get("context", {}))
            r["case"] = i
            out["results"].append(r)
    else:
        tdir = args.templates or default_template_dir()
        names = sorted(n for n in os.listdir(tdir) if n.endswith(".jinja"))
        templates = []
        for n in names:
            with open(os.path.join(tdir, n), encoding="utf-8") as f:
                templates.append({"name": n, "source": f.read()})
        convs = conversations()
        # Round-trip through JSON so both renderers see exactly the same data.
        convs = json.loads(json.dumps(convs))
        out["templates"] = templates
        out["conversations"] = convs
        out["results"] = []
        cache = {}
        for ti, t in enumerate(templates):
            for ci, c in enumerate(convs):
                r = render_one(env, t["source"], c["context"], cache)
                r["template"] = ti
                r["conversation"] = ci
                out["results"].append(r)
    json.dump(out, sys.stdout, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
