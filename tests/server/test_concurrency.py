#!/usr/bin/env python3
"""32 concurrent streaming requests at temperature 0 each receive exactly what
they receive alone: the same text, the same tokens and the same log-probs
(serval's batching is batch-invariant). Each request is first run alone, then
all 32 at once, with different prompts, lengths and endpoints."""

import contextlib
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Server, Suite, check, eq, metrics, post, run_threads, short, stream  # noqa: E402

suite = Suite("server_concurrency")
N_REQUESTS = 32


@suite.setup
@contextlib.contextmanager
def setup():
    with Server(name="concurrency") as srv:
        yield srv


BASE_PROMPTS = [
    "Once upon a time", "Lily and Ben went to the park", "The cat sat on the",
    "One day, a little boy named Tim found a", 'Mom said, "', "Tom had a red ball. He",
    "The sun was hot and the bird", "Sam liked to eat", "In the big forest there was a",
    "Anna and her dog",
]
USER_MSGS = ["Tell me a story.", "What is a cat?", "Say hello to Tom.", "Sing a song.",
             "Where is the ball?", "Why is the sky blue?", "Who is Lily?", "Count to three."]


def make_requests():
    reqs = []
    for i in range(N_REQUESTS):
        max_tokens = 8 + (i * 37) % 150  # 8 .. 157, all different lengths
        if i % 4 == 3:  # every 4th: chat
            body = {"messages": [{"role": "user", "content": USER_MSGS[(i // 4) % len(USER_MSGS)]}],
                    "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 2,
                    "stream": True, "stream_options": {"include_usage": True}}
            reqs.append(("/v1/chat/completions", body))
        else:
            prompt = BASE_PROMPTS[i % len(BASE_PROMPTS)]
            if i >= len(BASE_PROMPTS):
                prompt = prompt + " " + ["and", "with a", "but the", "so"][i % 4] + " " * (i % 3)
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2,
                    "stream": True, "stream_options": {"include_usage": True}}
            if i % 5 == 0:
                body["ignore_eos"] = True
            reqs.append(("/v1/completions", body))
    return reqs


def summarize(path, s):
    """(text, tokens, logprobs, finish_reasons, usage) of one streamed answer."""
    s.check_well_formed(path)
    chat = path.endswith("chat/completions")
    tokens, lps = [], []
    for e in s.events:
        for c in e.get("choices", []):
            lp = c.get("logprobs")
            if not lp:
                continue
            if chat:
                tokens += [x["token"] for x in lp["content"]]
                lps += [x["logprob"] for x in lp["content"]]
            else:
                tokens += lp["tokens"]
                lps += lp["token_logprobs"]
    return {"text": s.text(chat=chat), "tokens": tokens, "logprobs": lps, "finish": s.finish_reason(),
            "usage": s.usage()}


def compare(i, path, body, alone, together):
    what = f"request {i} ({path}, max_tokens {body['max_tokens']})"
    eq(together["text"], alone["text"], f"{what}: streamed text together vs alone")
    eq(together["tokens"], alone["tokens"], f"{what}: token sequence together vs alone")
    if together["logprobs"] != alone["logprobs"]:
        diff = max(abs(a - b) for a, b in zip(together["logprobs"], alone["logprobs"]))
        raise AssertionError(f"{what}: log-probs differ together vs alone (max |diff| {diff:g}); serval promises "
                             f"bit-identical results batched or not")
    eq(together["finish"], alone["finish"], f"{what}: finish_reason")
    strip = lambda u: {k: v for k, v in (u or {}).items() if k != "prompt_tokens_details"}  # noqa: E731
    eq(strip(together["usage"]), strip(alone["usage"]), f"{what}: usage (cached tokens aside)")


@suite.test
def concurrent_32_streams_equal_alone(srv):
    reqs = make_requests()
    alone = []
    t0 = time.monotonic()
    for path, body in reqs:
        s = stream(srv.port, path, body)
        alone.append(summarize(path, s))
        a = alone[-1]
        eq(len(a["tokens"]), a["usage"]["completion_tokens"], f"{path}: logprob entries = completion_tokens")
        eq("".join(a["tokens"]), a["text"], f"{path}: tokens concatenate to the text")
    t_alone = time.monotonic() - t0

    peak = {"running": 0, "stop": False}

    def sampler():
        while not peak["stop"]:
            try:
                m = metrics(srv.port)
                peak["running"] = max(peak["running"], m.get("serval_requests_running", 0))
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.01)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    t0 = time.monotonic()
    results = run_threads([lambda p=p, b=b: stream(srv.port, p, b) for p, b in reqs], timeout=120)
    t_together = time.monotonic() - t0
    peak["stop"] = True
    th.join()
    print(f"  alone: {t_alone:.2f} s sequentially; together: {t_together:.2f} s; "
          f"peak serval_requests_running {peak['running']:.0f}")
    errors = []
    for i, ((path, body), res) in enumerate(zip(reqs, results)):
        try:
            if isinstance(res, Exception):
                raise res
            compare(i, path, body, alone[i], summarize(path, res))
        except AssertionError as e:
            errors.append(str(e))
    check(not errors, f"{len(errors)} of {N_REQUESTS} requests differ:\n    " + "\n    ".join(short(e, 400) for e in errors[:8]))
    check(peak["running"] >= 2, f"the 32 requests never ran batched (peak serval_requests_running {peak['running']})")
    m = metrics(srv.port)
    eq(m.get("serval_kv_blocks_used"), 0, "serval_kv_blocks_used after all finished")
    eq(m.get("serval_requests_running"), 0, "serval_requests_running after all finished")


@suite.test
def concurrent_non_streaming_equal_alone(srv):
    # The same property without streaming, with n=2 and a stop string mixed in.
    reqs = []
    for i in range(16):
        body = {"prompt": BASE_PROMPTS[i % len(BASE_PROMPTS)], "max_tokens": 10 + 9 * i, "temperature": 0}
        if i % 3 == 0:
            body["stop"] = ["."]
        if i % 4 == 1:
            body.update(n=2, temperature=0.8, seed=100 + i)
        reqs.append(body)

    def run(b):
        r = post(srv.port, "/v1/completions", b)
        eq(r.status, 200, f"status of {short(b, 200)}")
        j = r.json()
        return [(c["text"], c["finish_reason"]) for c in j["choices"]], j["usage"]["completion_tokens"]

    alone = [run(b) for b in reqs]
    together = run_threads([lambda b=b: run(b) for b in reqs], timeout=120)
    for i, (a, t) in enumerate(zip(alone, together)):
        if isinstance(t, Exception):
            raise t
        eq(t, a, f"request {i} ({short(reqs[i], 200)}) together vs alone")


if __name__ == "__main__":
    raise SystemExit(suite.main())
