#!/usr/bin/env python3
"""Tool calls in each chat template's own format: with a template from
../shared/chat-templates whose format the tool grammar can produce (Hermes,
Qwen 2.5, Llama 3.x JSON, Mistral, Functionary v3.1/v3.2 and DeepSeek-R1 —
the last three with the function name outside the JSON, v3.2's after the
">>>" its generation prompt ends with; FireFunction's template needs a
`functions` variable of its own and Command-R7B's preamble alone is longer
than stories260K's context: both are covered by the parser tables), the constrained
output is written the way that model writes calls, the server parses it back
into OpenAI tool_calls whose arguments validate against the tool's schema,
and a streamed answer (name first, then argument deltas) reassembles to the
non-streamed one. stories260K writes whatever the grammar allows."""

import contextlib
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, eq, post, stream  # noqa: E402

import jsonschema  # noqa: E402  (python3-jsonschema)

suite = Suite("server_tool_formats")
H = "/v1/chat/completions"
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "add", "description": "Adds",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                          "required": ["a"]}}}]
TEMPLATES = {
    "hermes": "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "qwen": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "llama3": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "functionary31": "meetkai-functionary-medium-v3.1.jinja",
    "functionary32": "meetkai-functionary-medium-v3.2.jinja",
    "deepseek_r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
}
RAW_MARKERS = {"hermes": "<tool_call>", "qwen": "<tool_call>", "mistral": "[TOOL_CALLS]",
               "functionary31": "<function=", "deepseek_r1": "function<"}  # (R1's markers are byte tokens here)


class Ctx:
    pass


@suite.setup
@contextlib.contextmanager
def setup():
    ctx = Ctx()
    ctx.ports = {}
    with contextlib.ExitStack() as st:
        for key, file in TEMPLATES.items():
            srv = st.enter_context(Server(name=f"tools-{key}",
                                          chat_template=os.path.join(Config.shared, "chat-templates", file)))
            ctx.ports[key] = srv.port
        ctx.generic_port = st.enter_context(Server("--tool-call-format", "generic", name="tools-generic",
                                                   chat_template=os.path.join(Config.shared, "chat-templates",
                                                                              TEMPLATES["hermes"]))).port
        yield ctx


def body(**extra):
    return dict({"messages": MSG, "tools": TOOLS, "tool_choice": "required", "max_tokens": 400,
                 "temperature": 1.0, "seed": 7}, **extra)


def check_call(key, call):
    eq(call["type"], "function", f"{key}: type")
    name = call["function"]["name"]
    check(name in ("get_weather", "add"), f"{key}: name {name!r}")
    args = json.loads(call["function"]["arguments"])
    schema = PARAMS if name == "get_weather" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(args, schema)
    return name, call["function"]["arguments"]


@suite.test
def calls_parse_back_in_every_format(ctx):
    for key, port in ctx.ports.items():
        for seed in (1, 2, 3):
            r = post(port, H, body(seed=seed))
            eq(r.status, 200, f"{key}: status ({r.body[:300]!r})")
            c = r.json()["choices"][0]
            eq(c["finish_reason"], "tool_calls", f"{key}: finish_reason ({c['message']})")
            eq(c["message"]["content"], None, f"{key}: content")
            eq(len(c["message"]["tool_calls"]), 1, f"{key}: one call")
            check_call(key, c["message"]["tool_calls"][0])


@suite.test
def named_tool_choice_calls_that_tool(ctx):
    for key, port in ctx.ports.items():
        r = post(port, H, body(tool_choice={"type": "function", "function": {"name": "add"}}))
        eq(r.status, 200, f"{key}: status ({r.body[:300]!r})")
        name, _ = check_call(key, r.json()["choices"][0]["message"]["tool_calls"][0])
        eq(name, "add", f"{key}: the named tool")


@suite.test
def streamed_call_reassembles(ctx):
    for key, port in ctx.ports.items():
        whole = post(port, H, body()).json()["choices"][0]["message"]["tool_calls"][0]
        s = stream(port, H, body(stream=True))
        s.check_well_formed(key)
        name, args, ids, n_arg_deltas = None, "", set(), 0
        for ev in s.events:
            for ch in ev.get("choices", []):
                d = ch.get("delta") or {}
                check(not (d.get("content") or ""), f"{key}: no text around a required call: {d}")
                for tc in d.get("tool_calls", []):
                    eq(tc["index"], 0, f"{key}: index")
                    if "id" in tc:
                        ids.add(tc["id"])
                        name = tc["function"]["name"]
                    args += tc["function"].get("arguments", "")
                    n_arg_deltas += 1
        eq(len(ids), 1, f"{key}: one id, on the first delta")
        eq(name, whole["function"]["name"], f"{key}: streamed name")
        eq(args, whole["function"]["arguments"], f"{key}: streamed arguments")
        check(n_arg_deltas > 2, f"{key}: arguments arrive as several deltas ({n_arg_deltas})")
        eq(s.finish_reason(), ["tool_calls"], f"{key}: finish_reason")


@suite.test
def raw_text_is_the_templates_format(ctx):
    # The generated tokens themselves (logprobs) carry the template's marker:
    # the model is asked for calls the way it was trained to write them.
    for key, marker in RAW_MARKERS.items():
        port = ctx.ports[key]
        r = post(port, H, body(logprobs=True))
        toks = "".join(t["token"] for t in r.json()["choices"][0]["logprobs"]["content"])
        check(marker in toks, f"{key}: raw output {toks[:80]!r} carries {marker!r}")


@suite.test
def functionary_v32_writes_the_recipient(ctx):
    # The prompt ends with ">>>": a call is "NAME\n{args}", text is "all\n..." (returned without "all\n").
    port = ctx.ports["functionary32"]
    r = post(port, H, body(logprobs=True)).json()["choices"][0]
    toks = "".join(t["token"] for t in r["logprobs"]["content"])
    name = r["message"]["tool_calls"][0]["function"]["name"]
    check(toks.startswith(name + "\n{"), f"raw output {toks[:60]!r} starts with the recipient")
    texts = 0
    for seed in range(12):
        c = post(port, H, body(tool_choice="auto", seed=seed, max_tokens=40, logprobs=True)).json()["choices"][0]
        if c["finish_reason"] != "tool_calls":
            toks = "".join(t["token"] for t in c["logprobs"]["content"])
            check(toks.startswith("all\n"), f"text answer written to 'all': {toks[:40]!r}")
            eq(c["message"]["content"], toks[len("all\n"):], "content without the recipient")
            texts += 1
    check(texts > 0, "some auto answers are text")


@suite.test
def auto_gives_text_or_a_call(ctx):
    for key, port in ctx.ports.items():
        for seed in range(4):
            r = post(port, H, body(tool_choice="auto", seed=seed))
            eq(r.status, 200, f"{key}: status")
            c = r.json()["choices"][0]
            if c["finish_reason"] == "tool_calls":
                check_call(key, c["message"]["tool_calls"][0])
            else:
                check(isinstance(c["message"]["content"], str), f"{key}: text answer")
                check("tool_calls" not in c["message"], f"{key}: no calls with text")


@suite.test
def generic_format_on_request(ctx):
    r = post(ctx.generic_port, H, body(logprobs=True))
    eq(r.status, 200, "status")
    c = r.json()["choices"][0]
    toks = "".join(t["token"] for t in c["logprobs"]["content"])
    check("<tool_call>" not in toks and toks.lstrip().startswith("{"), f"generic call written: {toks[:80]!r}")
    check_call("generic", c["message"]["tool_calls"][0])


@suite.test
def bad_tool_call_format_is_refused(ctx):
    import subprocess
    p = subprocess.run([Config.serval, "serve", "-m", Config.model(), "--tool-call-format", "xml"],
                       capture_output=True, text=True, timeout=30)
    check(p.returncode != 0 and "tool-call format" in (p.stderr + p.stdout), f"refused: {p.stderr[-200:]!r}")


if __name__ == "__main__":
    suite.main()
