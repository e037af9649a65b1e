#!/usr/bin/env python3
"""Reasoning split off in chat completions: with a template whose model thinks
(DeepSeek-R1 distill, whose generation prompt opens "<think>"), the thinking
comes back as message.reasoning_content and .reasoning, streamed deltas carry
it the same way and reassemble to the non-streaming answer, and
--reasoning-format none keeps the raw text. The output is forced with a
`choice` constraint, since stories260K does not think by itself."""

import contextlib
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, eq, post, stream  # noqa: E402

suite = Suite("server_reasoning")
H = "/v1/chat/completions"
MSG = [{"role": "user", "content": "What is 2 + 2?"}]
FORCED = "Two and two.\nThat makes four.</think>\n\nIt is 4."


class Ctx:
    pass


def r1_template():
    return os.path.join(Config.shared, "chat-templates", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")


@suite.setup
@contextlib.contextmanager
def setup():
    ctx = Ctx()
    with contextlib.ExitStack() as st:
        ctx.port = st.enter_context(Server(name="reasoning", chat_template=r1_template())).port
        ctx.raw_port = st.enter_context(Server("--reasoning-format", "none", name="reasoning-raw",
                                               chat_template=r1_template())).port
        ctx.plain_port = st.enter_context(Server(name="reasoning-plain")).port  # Phi-3.5 template: no thinking
        yield ctx


def chat(port, **extra):
    body = dict({"messages": MSG, "max_tokens": 64, "choice": [FORCED]}, **extra)
    r = post(port, H, body)
    eq(r.status, 200, f"status ({r.body[:200]!r})")
    return r.json()["choices"][0]


@suite.test
def reasoning_split_from_the_answer(ctx):
    c = chat(ctx.port)
    eq(c["message"]["reasoning_content"], "Two and two.\nThat makes four.", "reasoning_content")
    eq(c["message"]["reasoning"], c["message"]["reasoning_content"], "reasoning (the alias)")
    eq(c["message"]["content"], "It is 4.", "content")
    eq(c["finish_reason"], "stop", "finish_reason")


@suite.test
def streamed_deltas_reassemble(ctx):
    whole = chat(ctx.port)["message"]
    s = stream(ctx.port, H, {"messages": MSG, "max_tokens": 64, "choice": [FORCED], "stream": True})
    s.check_well_formed("stream")
    reasoning, reasoning_alias = "", ""
    for ev in s.events:
        for ch in ev.get("choices", []):
            d = ch.get("delta") or {}
            reasoning += d.get("reasoning_content") or ""
            reasoning_alias += d.get("reasoning") or ""
            eq("</think>" in (d.get("content") or ""), False, "no tag in content deltas")
    eq(reasoning, whole["reasoning_content"], "streamed reasoning_content")
    eq(reasoning_alias, whole["reasoning"], "streamed reasoning")
    eq(s.text(chat=True), whole["content"], "streamed content")


@suite.test
def reasoning_format_none_keeps_raw_text(ctx):
    c = chat(ctx.raw_port)
    eq(c["message"]["content"], FORCED, "content")
    eq("reasoning_content" in c["message"], False, "no reasoning_content")


@suite.test
def templates_without_thinking_are_untouched(ctx):
    forced = "<think>not a reasoning model</think>Hello"
    c = chat(ctx.plain_port, choice=[forced])
    eq(c["message"]["content"], forced, "content")
    eq("reasoning_content" in c["message"], False, "no reasoning_content")


@suite.test
def bad_flag_value_is_refused(ctx):
    import subprocess
    p = subprocess.run([Config.serval, "serve", "-m", Config.model(), "--reasoning-format", "sometimes"],
                       capture_output=True, text=True, timeout=30)
    eq(p.returncode != 0, True, "non-zero exit")
    eq("reasoning-format" in (p.stderr + p.stdout), True, f"message names the flag: {p.stderr[-200:]!r}")


if __name__ == "__main__":
    suite.main()
