#!/usr/bin/env python3
"""The Anthropic Messages API and the OpenAI Responses API over HTTP, beyond
what the official SDKs exercise (tests/server/node): reasoning becomes
`thinking` blocks and `reasoning` items (DeepSeek-R1 template, whose
generation prompt opens <think>), x-api-key, the store's owner isolation and
bound, and bad input — malformed bodies, missing and mistyped fields, images
and other unsupported blocks, tool results for unknown ids, unsupported
tools — each a 4xx in that API's error shape, with the server serving on."""

import contextlib
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, check_error_body, eq, post, request, stream  # noqa: E402

suite = Suite("server_messages_responses")
M, R, CT = "/v1/messages", "/v1/responses", "/v1/messages/count_tokens"
KEY = "sk-msg-test"
OTHER = "sk-msg-other"
AUTH = {"Authorization": f"Bearer {KEY}"}
XKEY = {"x-api-key": KEY}
USER = [{"role": "user", "content": "Tell me a story."}]


class Ctx:
    pass


@suite.setup
@contextlib.contextmanager
def setup():
    ctx = Ctx()
    r1 = os.path.join(Config.shared, "chat-templates", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    with contextlib.ExitStack() as st:
        ctx.port = st.enter_context(Server("--api-key", KEY, "--api-key", OTHER, "--responses-store", "3",
                                           name="msg")).port
        ctx.r1_port = st.enter_context(Server(name="msg-r1", chat_template=r1)).port
        yield ctx


def anthropic_error(resp, status, what, pattern=None, type_=None):
    """Asserts Anthropic's error shape {"type": "error", "error": {"type", "message"}}."""
    check(resp.status == status, f"{what}: expected {status}, got {resp.status} {resp.body[:300]!r}")
    check(resp.header("content-type").startswith("application/json"), f"{what}: JSON content type")
    j = json.loads(resp.body)
    eq(j.get("type"), "error", f"{what}: top-level type")
    e = j.get("error")
    check(isinstance(e, dict) and isinstance(e.get("type"), str) and isinstance(e.get("message"), str) and e["message"],
          f"{what}: error object {j}")
    check("param" not in e and "code" not in e, f"{what}: Anthropic errors have no param/code: {j}")
    if type_:
        eq(e["type"], type_, f"{what}: error.type")
    if pattern:
        check(pattern in e["message"], f"{what}: message {e['message']!r} should mention {pattern!r}")
    return e


@suite.test
def x_api_key_and_bearer_both_authenticate(ctx):
    for h in (AUTH, XKEY):
        r = post(ctx.port, M, {"model": "stories260K", "max_tokens": 4, "messages": USER}, headers=h)
        eq(r.status, 200, f"status with {list(h)} ({r.body[:200]!r})")
    # x-api-key works on the OpenAI routes too (one key header for a client of both APIs).
    eq(post(ctx.port, "/v1/chat/completions", {"messages": USER, "max_tokens": 2}, headers=XKEY).status, 200, "chat")
    anthropic_error(post(ctx.port, M, {"model": "stories260K", "max_tokens": 4, "messages": USER}), 401, "no key",
                    type_="authentication_error")
    anthropic_error(post(ctx.port, M, {"model": "stories260K", "max_tokens": 4, "messages": USER},
                         headers={"x-api-key": "wrong"}), 401, "wrong key", type_="authentication_error")
    anthropic_error(post(ctx.port, CT, {"model": "x", "messages": USER}, headers={"x-api-key": "wrong"}), 401,
                    "count_tokens wrong key", type_="authentication_error")
    check_error_body(post(ctx.port, R, {"input": "x"}, headers={"x-api-key": "wrong"}), 401, "responses wrong key")
    anthropic_error(request(ctx.port, "GET", M, headers=XKEY), 405, "GET /v1/messages")


@suite.test
def messages_bad_input(ctx):
    ok = {"model": "stories260K", "max_tokens": 8, "messages": USER}
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    cases = [
        (b"{not json", "valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b"[" * 500 + b"]" * 500, "nests"),
        ({k: v for k, v in ok.items() if k != "max_tokens"}, "max_tokens"),
        (dict(ok, max_tokens=0), "max_tokens"),
        (dict(ok, max_tokens="10"), "max_tokens"),
        ({k: v for k, v in ok.items() if k != "model"}, "model"),
        (dict(ok, messages=[]), "messages"),
        (dict(ok, messages="hi"), "messages"),
        (dict(ok, messages=[{"role": "system", "content": "x"}]), "role"),
        (dict(ok, messages=[{"role": "user"}]), "content"),
        (dict(ok, messages=[{"role": "user", "content": 5}]), "content"),
        (dict(ok, messages=[{"role": "user", "content": [img]}]), "image"),
        (dict(ok, messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]), "document"),
        (dict(ok, messages=[{"role": "user", "content": [{"type": "text"}]}]), "text"),
        (dict(ok, messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                                          "content": "r"}]}]), "toolu_x"),
        (dict(ok, messages=[{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
         "assistant"),
        (dict(ok, messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f",
                                                               "input": "not an object"}]}, USER[0]]), "input"),
        (dict(ok, system=[img]), "image"),
        (dict(ok, system=5), "system"),
        (dict(ok, stop_sequences="END"), "stop_sequences"),
        (dict(ok, stop_sequences=[1]), "stop_sequences"),
        (dict(ok, temperature="hot"), "temperature"),
        (dict(ok, temperature=-1), "temperature"),
        (dict(ok, stream="yes"), "stream"),
        (dict(ok, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "server tools"),
        (dict(ok, tools=[{"name": "f"}]), "input_schema"),
        (dict(ok, tools=[{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "wat"}}}}]),
         "tools"),
        (dict(ok, tool_choice={"type": "any"}), "needs tools"),
        (dict(ok, tool_choice={"type": "sometimes"}), "tool_choice"),
        (dict(ok, tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice={"type": "tool"}), "name"),
        (dict(ok, tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice={"type": "tool", "name": "g"}),
         "g"),
        (dict(ok, thinking={"type": "maybe"}), "thinking"),
        (dict(ok, stop_sequences=["s"] * 17), "stop"),
    ]
    for body, pattern in cases:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        anthropic_error(post(ctx.port, M, raw, headers=dict(XKEY, **{"Content-Type": "application/json"})), 400,
                        f"{raw[:120]!r}", pattern=pattern, type_="invalid_request_error")
    anthropic_error(post(ctx.port, M, dict(ok, model="claude-9"), headers=XKEY), 404, "unknown model",
                    type_="not_found_error")
    anthropic_error(post(ctx.port, CT, {"model": "stories260K"}, headers=XKEY), 400, "count_tokens without messages",
                    pattern="messages")
    # A stream refused before it starts is a plain JSON error too.
    anthropic_error(post(ctx.port, M, dict(ok, stream=True, messages=[{"role": "user", "content": [img]}]),
                         headers=XKEY), 400, "stream with an image")
    eq(post(ctx.port, M, ok, headers=XKEY).status, 200, "still serving")


@suite.test
def responses_bad_input(ctx):
    ok = {"input": "Tell me a story.", "max_output_tokens": 8}
    cases = [
        (b"{not json", None),
        (b"null", None),
        ({"max_output_tokens": 5}, "input"),
        (dict(ok, input=5), "input"),
        (dict(ok, input=[]), "input"),
        (dict(ok, input=[{"role": "tool", "content": "x"}]), "input[0].role"),
        (dict(ok, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]),
         "input[0].content[0].type"),
        (dict(ok, input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
         "input[0].content[0].type"),
        (dict(ok, input=[{"type": "function_call_output", "call_id": "call_x", "output": "r"}]), "input[0].call_id"),
        (dict(ok, input=[{"type": "function_call", "call_id": "c", "name": "f"}]), "input[0].arguments"),
        (dict(ok, input=[{"type": "item_reference", "id": "x"}]), "input[0].type"),
        (dict(ok, input=[{"type": "web_search_call"}]), "input[0].type"),
        (dict(ok, max_output_tokens=0), "max_output_tokens"),
        (dict(ok, max_output_tokens=10 ** 9), "max_output_tokens"),
        (dict(ok, temperature=7 ** 9), "temperature"),
        (dict(ok, instructions=["x"]), "instructions"),
        (dict(ok, tools=[{"type": "web_search"}]), "tools[0].type"),
        (dict(ok, tools=[{"type": "function"}]), "tools[0].name"),
        (dict(ok, tools=[{"type": "function", "name": "f", "parameters": {"type": "object",
                                                                          "properties": {"a": {"type": "wat"}}}}]),
         "tools"),
        (dict(ok, tool_choice="required"), "tool_choice"),
        (dict(ok, tool_choice={"type": "function", "name": "f"}), "tool_choice"),
        (dict(ok, text={"format": {"type": "xml"}}), "text.format.type"),
        (dict(ok, text={"format": {"type": "json_schema", "name": "x"}}), "text.format.schema"),
        (dict(ok, text={"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "wat"}}}}}),
         "text.format"),
        (dict(ok, previous_response_id="resp_nope"), "previous_response_id"),
        (dict(ok, previous_response_id=5), "previous_response_id"),
        (dict(ok, background=True), "background"),
        (dict(ok, conversation="conv_1"), "conversation"),
        (dict(ok, metadata={"k": 5}), "metadata"),
        (dict(ok, store="yes"), "store"),
        (dict(ok, stream=1), "stream"),
        (dict(ok, model="gpt-9"), "model"),
    ]
    for body, param in cases:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = post(ctx.port, R, raw, headers=dict(AUTH, **{"Content-Type": "application/json"}))
        check_error_body(r, (400, 404), f"{raw[:120]!r}", param=param)
    eq(post(ctx.port, R, ok, headers=AUTH).status, 200, "still serving")
    check_error_body(request(ctx.port, "PUT", R + "/resp_x", headers=AUTH), 405, "PUT a response")
    check_error_body(request(ctx.port, "GET", R + "/resp_x", headers=AUTH), 404, "unknown id")


@suite.test
def stored_responses_are_per_key_and_bounded(ctx):
    other = {"Authorization": f"Bearer {OTHER}"}
    ids = []
    for k in range(4):
        r = post(ctx.port, R, {"input": f"Story {k}.", "max_output_tokens": 3}, headers=AUTH)
        eq(r.status, 200, "create")
        ids.append(r.json()["id"])
    # --responses-store 3: the oldest is gone, the newest three are kept.
    check_error_body(request(ctx.port, "GET", R + "/" + ids[0], headers=AUTH), 404, "evicted")
    for i in ids[1:]:
        eq(request(ctx.port, "GET", R + "/" + i, headers=AUTH).json()["id"], i, "kept")
    # Another key sees none of them and cannot continue or delete them.
    check_error_body(request(ctx.port, "GET", R + "/" + ids[3], headers=other), 404, "other key: GET")
    check_error_body(post(ctx.port, R, {"input": "x", "previous_response_id": ids[3]}, headers=other), 400,
                     "other key: previous_response_id", param="previous_response_id")
    check_error_body(request(ctx.port, "DELETE", R + "/" + ids[3], headers=other), 404, "other key: DELETE")
    # store: false is not kept.
    r = post(ctx.port, R, {"input": "x", "max_output_tokens": 2, "store": False}, headers=AUTH).json()
    eq(r["store"], False, "store echoed")
    check_error_body(request(ctx.port, "GET", R + "/" + r["id"], headers=AUTH), 404, "store: false")


@suite.test
def reasoning_becomes_thinking_blocks_and_reasoning_items(ctx):
    """The R1 template's generation prompt opens <think>: what stories260K writes is reasoning."""
    chat = post(ctx.r1_port, "/v1/chat/completions", {"messages": USER, "max_tokens": 12, "temperature": 0}).json()
    reasoning = chat["choices"][0]["message"]["reasoning_content"]
    check(reasoning, f"the chat answer has reasoning: {chat}")
    m = post(ctx.r1_port, M, {"model": "x", "max_tokens": 12, "temperature": 0, "messages": USER})
    anthropic_error(m, 404, "model name checked")
    m = post(ctx.r1_port, M, {"model": chat["model"], "max_tokens": 12, "temperature": 0, "messages": USER}).json()
    eq(m["content"][0]["type"], "thinking", "first block")
    eq(m["content"][0]["thinking"], reasoning, "thinking text")
    eq(m["stop_reason"], "max_tokens", "stop_reason")
    s = stream(ctx.r1_port, M, {"model": chat["model"], "max_tokens": 12, "temperature": 0, "messages": USER,
                                "stream": True})
    deltas = [e["delta"] for e in s.events if e.get("type") == "content_block_delta"]
    eq("".join(d.get("thinking", "") for d in deltas if d["type"] == "thinking_delta"), reasoning, "streamed thinking")
    check(any(d["type"] == "signature_delta" for d in deltas), "a signature_delta closes the thinking block")
    starts = [e["content_block"]["type"] for e in s.events if e.get("type") == "content_block_start"]
    eq(starts[0], "thinking", "streamed block type")
    r = post(ctx.r1_port, R, {"input": USER, "max_output_tokens": 12, "temperature": 0}).json()
    eq(r["output"][0]["type"], "reasoning", "first output item")
    eq(r["output"][0]["content"][0]["text"], reasoning, "reasoning text")
    s = stream(ctx.r1_port, R, {"input": USER, "max_output_tokens": 12, "temperature": 0, "stream": True})
    eq("".join(e["delta"] for e in s.events if e.get("type") == "response.reasoning_text.delta"), reasoning,
       "streamed reasoning")
    eq(s.events[-1]["type"], "response.incomplete", "last event")


@suite.test
def streams_end_cleanly(ctx):
    """Anthropic streams end with message_stop, Responses streams with response.completed/incomplete; no [DONE]."""
    s = stream(ctx.port, M, {"model": "stories260K", "max_tokens": 6, "messages": USER, "stream": True}, headers=XKEY)
    check(s.error is None and s.status == 200, f"stream: {s.error} {s.status}")
    eq(s.events[-1]["type"], "message_stop", "last Anthropic event")
    check(not s.done, "no [DONE] in an Anthropic stream")
    s = stream(ctx.port, R, {"input": "Hi", "max_output_tokens": 6, "stream": True}, headers=AUTH)
    check(s.error is None and s.status == 200, f"stream: {s.error} {s.status}")
    eq([e["sequence_number"] for e in s.events], list(range(len(s.events))), "sequence numbers")
    check(s.events[-1]["type"] in ("response.completed", "response.incomplete"), "last Responses event")
    check(not s.done, "no [DONE] in a Responses stream")


if __name__ == "__main__":
    suite.main()
