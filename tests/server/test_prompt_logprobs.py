#!/usr/bin/env python3
"""Prompt log-probs over HTTP: the lm-evaluation-harness loglikelihood pattern
(`echo`, `logprobs: 1`, `max_tokens: 0` or 1, token-id prompts, several per
request) returns each prompt token's log-prob (the first null), equal to the
teacher-forced value a decode step reports for that token after the prompt's
prefix (forced by a +100 logit_bias; log-probs are of the raw logits); vLLM's
`prompt_logprobs: N` (completions and chat); streaming echo; results that do
not depend on concurrent requests; and bad requests."""

import sys
import threading

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Server, Suite, check, check_error_body, eq, post, stream  # noqa: E402

suite = Suite("server_prompt_logprobs")
C = "/v1/completions"


def lcg_prompts():
    """Four token-id prompts (BOS first) of 20..38 tokens; two share a 17-token prefix."""
    out, state = [], [987]

    def nxt():
        state[0] = (state[0] * 1103515245 + 12345) % (1 << 31)
        return 3 + (state[0] >> 8) % 500
    shared = [1] + [nxt() for _ in range(16)]
    for k in range(4):
        p = (shared if k % 2 == 0 else [1]) + [nxt() for _ in range(3 + 6 * k)]
        out.append(p)
    return out


PROMPTS = lcg_prompts()


@suite.setup
def setup():
    return Server(name="prompt-logprobs")


def score(port, prompts, **extra):
    body = dict({"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}, **extra)
    r = post(port, C, body)
    eq(r.status, 200, f"status ({r.body[:300]!r})")
    return sorted(r.json()["choices"], key=lambda c: c["index"]), r.json()


def forced(port, prefix, token):
    body = {"prompt": prefix, "max_tokens": 1, "temperature": 0, "logprobs": 1, "logit_bias": {str(token): 100}}
    r = post(port, C, body)
    eq(r.status, 200, f"forced status ({r.body[:300]!r})")
    lp = r.json()["choices"][0]["logprobs"]
    return lp["token_logprobs"][0], lp["top_logprobs"][0]


@suite.test
def loglikelihood_pattern_equals_teacher_forcing(ctx):
    choices, whole = score(ctx.port, PROMPTS)
    eq(len(choices), len(PROMPTS), "one choice per prompt")
    eq(whole["usage"]["completion_tokens"], 0, "nothing generated")
    eq(whole["usage"]["prompt_tokens"], sum(len(p) for p in PROMPTS), "prompt_tokens")
    compared = 0
    for p, c in zip(PROMPTS, choices):
        lp = c["logprobs"]
        eq(len(lp["token_logprobs"]), len(p), "one entry per prompt token")
        eq(lp["token_logprobs"][0], None, "the first token has no log-prob")
        eq(lp["top_logprobs"][0], None, "nor top log-probs")
        eq(c["finish_reason"], "length", "finish_reason")
        for i in range(1, len(p)):
            want, top = forced(ctx.port, p[:i], p[i])
            eq(lp["token_logprobs"][i], want, f"position {i} of a {len(p)}-token prompt")
            # lm-eval's is_greedy: the top-1 entry is the greedy token's log-prob.
            eq(max(lp["top_logprobs"][i].values()), max(top.values()), f"top-1 at position {i}")
            check(lp["token_logprobs"][i] <= max(lp["top_logprobs"][i].values()), "no token beats the top-1")
            compared += 1
    check(compared >= 80, f"compared {compared} positions")


@suite.test
def max_tokens_one_variant_has_the_same_prompt_logprobs(ctx):
    """lm-eval's local-completions sends max_tokens 1 and drops the last entry."""
    zero, _ = score(ctx.port, PROMPTS)
    one, _ = score(ctx.port, PROMPTS, max_tokens=1)
    for p, a, b in zip(PROMPTS, zero, one):
        eq(len(b["logprobs"]["token_logprobs"]), len(p) + 1, "prompt tokens + 1 generated")
        eq(b["logprobs"]["token_logprobs"][:len(p)], a["logprobs"]["token_logprobs"], "prompt log-probs")
        eq(b["logprobs"]["tokens"][:len(p)], a["logprobs"]["tokens"], "prompt tokens")
        check(b["text"].startswith(a["text"]), "echoed text then the generated token")


@suite.test
def vllm_prompt_logprobs(ctx):
    p = PROMPTS[1]
    echo, _ = score(ctx.port, [p], logprobs=3)
    r = post(ctx.port, C, {"prompt": p, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 3})
    eq(r.status, 200, f"status ({r.body[:300]!r})")
    pl = r.json()["choices"][0]["prompt_logprobs"]
    eq(len(pl), len(p), "one entry per prompt token")
    eq(pl[0], None, "the first is null")
    for i in range(1, len(p)):
        e = pl[i]
        mine = e[str(p[i])]
        eq(mine["logprob"], echo[0]["logprobs"]["token_logprobs"][i], f"position {i}: same log-prob as echo")
        check(isinstance(mine["decoded_token"], str), "decoded_token")
        ranked = sorted(e.values(), key=lambda v: v["rank"])
        eq(mine["rank"] == 1, ranked[0] is mine, f"rank 1 is the best token (position {i})")
        check(len(e) in (3, 4), f"the token and the 3 best: {e}")
    chat = post(ctx.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi there"}],
                                                  "max_tokens": 2, "prompt_logprobs": 0})
    eq(chat.status, 200, f"chat status ({chat.body[:300]!r})")
    cp = chat.json()["prompt_logprobs"]
    eq(cp[0], None, "chat: first null")
    check(len(cp) > 3 and all(len(e) == 1 for e in cp[1:]), "chat: the prompt token's own entry only")


@suite.test
def text_offsets_point_into_the_echoed_text(ctx):
    r = post(ctx.port, C, {"prompt": "Once upon a time, a little cat", "echo": True, "logprobs": 1, "max_tokens": 4,
                           "temperature": 0})
    eq(r.status, 200, "status")
    c = r.json()["choices"][0]
    lp, text = c["logprobs"], c["text"]
    check(text.startswith("Once upon a time, a little cat"), f"echo: {text!r}")
    for t, o in zip(lp["tokens"], lp["text_offset"]):
        eq(text[o:o + len(t)], t, f"token {t!r} at offset {o}")
    eq(lp["token_logprobs"][0], None, "first null")
    eq(len(lp["tokens"]), len(lp["token_logprobs"]), "lists of one length")


@suite.test
def streaming_echo_reassembles(ctx):
    body = {"prompt": PROMPTS[2], "echo": True, "logprobs": 2, "max_tokens": 6, "temperature": 0}
    whole = post(ctx.port, C, body).json()["choices"][0]
    s = stream(ctx.port, C, dict(body, stream=True))
    s.check_well_formed("stream")
    toks, lps, text = [], [], ""
    for ev in s.events:
        for ch in ev["choices"]:
            text += ch.get("text") or ""
            if ch.get("logprobs"):
                toks += ch["logprobs"]["tokens"]
                lps += ch["logprobs"]["token_logprobs"]
    eq(text, whole["text"], "text")
    eq(toks, whole["logprobs"]["tokens"], "tokens")
    eq(lps, whole["logprobs"]["token_logprobs"], "token_logprobs")


@suite.test
def concurrent_requests_do_not_change_scores(ctx):
    alone, _ = score(ctx.port, PROMPTS)
    results, errors = [None] * 6, []

    def run(k):
        try:
            results[k] = score(ctx.port, PROMPTS if k % 2 == 0 else PROMPTS[::-1])[0]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def noise():
        post(ctx.port, C, {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 1.0})
    threads = [threading.Thread(target=run, args=(k,)) for k in range(6)] + \
        [threading.Thread(target=noise) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, f"errors: {errors}")
    for k, got in enumerate(results):
        order = PROMPTS if k % 2 == 0 else PROMPTS[::-1]
        want = alone if k % 2 == 0 else alone[::-1]
        for p, a, b in zip(order, want, got):
            eq(b["logprobs"]["token_logprobs"], a["logprobs"]["token_logprobs"], f"request {k}")


@suite.test
def bad_requests(ctx):
    p = PROMPTS[0]
    cases = [
        ({"prompt": p, "max_tokens": 0}, "max_tokens"),
        ({"prompt": p, "max_tokens": -1, "echo": True}, "max_tokens"),
        ({"prompt": p, "max_tokens": 0, "echo": True, "n": 2}, "n"),
        ({"prompt": p, "max_tokens": 0, "echo": True, "stream": True}, "stream"),
        ({"prompt": p, "max_tokens": 2, "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt": p, "max_tokens": 2, "prompt_logprobs": "all"}, "prompt_logprobs"),
        ({"prompt": p, "max_tokens": 2, "prompt_logprobs": 1, "use_beam_search": True, "n": 2}, "prompt_logprobs"),
        ({"prompt": p, "max_tokens": 2, "echo": True, "logprobs": 1, "beam_width": 2}, "echo"),
        ({"prompt": p, "max_tokens": 2, "logprobs": 21, "echo": True}, "logprobs"),
    ]
    for body, param in cases:
        check_error_body(post(ctx.port, C, body), 400, f"{body}", param=param)
    r = post(ctx.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})
    check_error_body(r, 400, "chat max_tokens 0", param="max_tokens")
    # The server still answers normally.
    eq(score(ctx.port, [p])[0][0]["logprobs"]["token_logprobs"][0], None, "still serving")


if __name__ == "__main__":
    suite.main()
