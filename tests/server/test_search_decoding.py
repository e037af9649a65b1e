#!/usr/bin/env python3
"""Search decoding end to end on stories260K (docs/SEARCH_DECODING.md): beam
search (vLLM's use_beam_search/best_of and beam_width) and diverse beam search
on both endpoints return n distinct choices ordered by beam_score, the same on
every call; contrastive search (penalty_alpha, top_k) is deterministic and
streams the same text it returns; a client that goes away mid-search frees
every beam's KV blocks; bad values get a 400 naming the field."""

import contextlib
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import (  # noqa: E402
    Server, Suite, abort, check, check_error_body, eq, metrics, post, short, stream, wait_until)

suite = Suite("server_search_decoding")
C, H = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "Tell me about a cat."}]


@suite.setup
@contextlib.contextmanager
def setup():
    with Server(name="search") as srv:
        yield srv  # the tests use its port


def ok(ctx, path, body):
    r = post(ctx.port, path, body, timeout=120)
    eq(r.status, 200, f"POST {path} {short(body, 300)} status ({short(r.body, 300)})")
    return r.json()


def texts(path, j):
    return [c["text"] if path == C else c["message"]["content"] for c in j["choices"]]


def check_ranked(path, j, n, what):
    eq(len(j["choices"]), n, f"{what}: choices")
    scores = [c.get("beam_score") for c in j["choices"]]
    check(all(isinstance(s, float) for s in scores), f"{what}: every choice has a beam_score: {scores}")
    check(all(a >= b for a, b in zip(scores, scores[1:])), f"{what}: choices not ordered by beam_score: {scores}")
    check(all(s <= 0 for s in scores), f"{what}: a log-probability score above 0: {scores}")
    eq([c["index"] for c in j["choices"]], list(range(n)), f"{what}: indices")


@suite.test
def beam_search_on_both_endpoints(ctx):
    bodies = [
        {"use_beam_search": True, "best_of": 4, "n": 3, "max_tokens": 12},
        {"beam_width": 4, "n": 4, "max_tokens": 12, "length_penalty": 0.5, "early_stopping": "never"},
        {"beam_width": 4, "num_beam_groups": 2, "diversity_penalty": 1.5, "n": 4, "max_tokens": 12,
         "early_stopping": True},
    ]
    for path in (C, H):
        for b in bodies:
            body = dict(b)
            body.update({"prompt": "Once upon a time"} if path == C else {"messages": MSG})
            what = f"{path} {short(b, 200)}"
            j = ok(ctx, path, body)
            check_ranked(path, j, b["n"], what)
            again = ok(ctx, path, body)
            eq(texts(path, again), texts(path, j), f"{what}: the same choices on a second call")
            eq(j["usage"]["completion_tokens"] > 0, True, f"{what}: completion tokens counted")


@suite.test
def beam_search_streams_each_hypothesis(ctx):
    body = {"prompt": "Once upon a time", "beam_width": 3, "n": 3, "max_tokens": 10}
    whole = ok(ctx, C, body)
    s = stream(ctx.port, C, dict(body, stream=True))
    eq(s.status, 200, "stream status")
    got = {}
    for ev in s.events:
        for ch in ev.get("choices", []):
            got[ch["index"]] = got.get(ch["index"], "") + ch.get("text", "")
    eq([got.get(i) for i in range(3)], texts(C, whole), "streamed hypotheses")


@suite.test
def contrastive_search_is_deterministic_and_streams(ctx):
    body = {"prompt": "Once upon a time", "penalty_alpha": 0.6, "top_k": 4, "max_tokens": 24}
    a = ok(ctx, C, body)["choices"][0]["text"]
    b = ok(ctx, C, dict(body, temperature=1.5, seed=7))["choices"][0]["text"]
    eq(b, a, "contrastive search ignores temperature and seed")
    greedy = ok(ctx, C, {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 24})["choices"][0]["text"]
    check(a != greedy, f"contrastive search equals greedy decoding: {a!r}")
    s = stream(ctx.port, C, dict(body, stream=True))
    eq(s.status, 200, "stream status")
    eq("".join(ev["choices"][0].get("text", "") for ev in s.events if ev.get("choices")), a, "streamed text")


@suite.test
def client_gone_mid_search_frees_every_beam(ctx):
    for extra in ({"beam_width": 8}, {"penalty_alpha": 0.5, "top_k": 8}):
        body = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True, "stream": True, **extra}
        conns = []
        seen = {}

        def busy():
            m = metrics(ctx.port)
            seen["kv"] = m.get("serval_kv_blocks_used")
            return m if (seen["kv"] or 0) > 8 else None

        t = threading.Thread(target=lambda: stream(ctx.port, C, body, timeout=60, conn_out=conns), daemon=True)
        t.start()
        wait_until(busy, timeout=20, interval=0.02)
        check((seen.get("kv") or 0) > 8, f"{extra}: KV blocks in use while searching = {seen.get('kv')}, want > 8")
        for c in conns:
            abort(c)
        t0 = time.monotonic()
        idle = wait_until(lambda: metrics(ctx.port).get("serval_kv_blocks_used") == 0 or None, timeout=10,
                          interval=0.02)
        check(idle is not None, f"{extra}: KV blocks not freed {time.monotonic() - t0:.1f} s after the client left")


@suite.test
def bad_values_get_400_naming_the_field(ctx):
    base = {"prompt": "Once upon a time", "max_tokens": 8}
    cases = [
        ({"beam_width": 17}, "beam_width"),
        ({"beam_width": -1}, "beam_width"),
        ({"beam_width": 4, "n": 5}, "n"),
        ({"use_beam_search": True, "n": 1}, "best_of"),
        ({"use_beam_search": True, "best_of": 4, "beam_width": 2}, "best_of"),
        ({"beam_width": 4, "num_beam_groups": 3}, "num_beam_groups"),
        ({"beam_width": 4, "diversity_penalty": 1.0}, "diversity_penalty"),
        ({"beam_width": 4, "num_beam_groups": 2, "diversity_penalty": -1}, "diversity_penalty"),
        ({"beam_width": 4, "length_penalty": "long"}, "length_penalty"),
        ({"beam_width": 4, "length_penalty": 1e9}, "length_penalty"),
        ({"beam_width": 4, "early_stopping": "sometimes"}, "early_stopping"),
        ({"beam_width": 4, "stop": ["."]}, "stop"),
        ({"beam_width": 4, "logprobs": 2}, "logprobs"),
        ({"beam_width": 4, "response_format": {"type": "json_object"}}, "beam_width"),
        ({"penalty_alpha": 1.5, "top_k": 4}, "penalty_alpha"),
        ({"penalty_alpha": 0.5, "top_k": 65}, "top_k"),
        ({"penalty_alpha": 0.5, "top_k": 4, "n": 2}, "n"),
        ({"penalty_alpha": 0.5, "top_k": 4, "beam_width": 2}, "penalty_alpha"),
    ]
    for extra, param in cases:
        r = post(ctx.port, C, {**base, **extra})
        check_error_body(r, 400, f"{extra}", param=param)
    # The server still searches after all that.
    check_ranked(C, ok(ctx, C, {**base, "beam_width": 2, "n": 2}), 2, "after the bad requests")


if __name__ == "__main__":
    raise SystemExit(suite.main())
