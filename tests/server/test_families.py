#!/usr/bin/env python3
"""The model families through `serval serve`: for the llama3, qwen3, gemma3 and
phi3 files of ../shared/models/arch/ and the qwen3moe and gpt-oss
mixture-of-experts files, llama.cpp's (ik_llama.cpp) greedy paths
and top-5 log-probs (../shared/golden/arch.json) teacher-forced through
/v1/completions: each step is one request whose prompt is the golden prompt
plus the golden tokens so far (as token ids), with logprobs=5; our top-5
values are within mean 0.005 / max 0.03 of the golden's, and our top-1 is
the golden's greedy token wherever its top-2 gap exceeds 0.01. Then a greedy
run of 40 tokens in one request (the gemma3 file's 32-token window crossed in
decode steps) returns the golden's log-probs while its path is the golden's."""

import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, eq, post, short, teacher_forced  # noqa: E402

suite = Suite("server_families")
FILES = ["mini-llama3-F16.gguf", "mini-qwen3-F16.gguf", "mini-gemma3-F16.gguf", "mini-phi3-F16.gguf",
         "mini-qwen3moe-F16.gguf", "mini-gpt-oss-F16.gguf"]


def golden():
    with open(os.path.join(Config.shared, "golden", "arch.json")) as f:
        return json.load(f)


def completion(port, body):
    r = post(port, "/v1/completions", body, timeout=60)
    eq(r.status, 200, f"POST /v1/completions {short(body, 200)} ({short(r.body, 300)})")
    return r.json()


def detok(port, ids):
    r = post(port, "/detokenize", {"tokens": ids})
    eq(r.status, 200, "detokenize")
    return r.json()["prompt"]


def check_family(file):
    cases = golden()[file]
    model = os.path.join(Config.shared, "models", "arch", file)
    with Server("--kv-type", "f32", name=file, model=model, chat_template=False) as srv:
        mean, worst, n, gap_steps, gap_agree = teacher_forced(srv.port, cases)
        print(f"{file}: teacher-forced through the server: mean |d logprob| {mean:.5f} max {worst:.5f} over {n} "
              f"values; greedy agreement {gap_agree}/{gap_steps} (gap > 0.01)")
        check(n >= 200, f"{file}: only {n} comparable values")
        check(mean <= 0.005, f"{file}: mean |d logprob| {mean:.5f} > 0.005")
        check(worst <= 0.03, f"{file}: max |d logprob| {worst:.5f} > 0.03")
        check(gap_steps >= 60 and gap_agree == gap_steps,
              f"{file}: greedy token differs at {gap_steps - gap_agree} of {gap_steps} decided steps")

        # One greedy request of 40 tokens (decode steps through the engine; the
        # gemma3 window is crossed): its log-probs are the golden's top-1.
        for case in cases:
            j = completion(srv.port, {"prompt": case["prompt_tokens"], "max_tokens": 40, "temperature": 0,
                                      "logprobs": 1})
            lp = j["choices"][0]["logprobs"]["token_logprobs"]
            eq(len(lp), 40, "40 generated tokens")
            # /detokenize drops the SPM space prefix of a text's first token (as
            # llama.cpp's detokenize does); a continuation keeps it.
            eq(j["choices"][0]["text"].removeprefix(" "), detok(srv.port, case["greedy_tokens"]).removeprefix(" "),
               f"{file}: greedy text vs golden")
            d = max(abs(a - t[0]["logprob"]) for a, t in zip(lp, case["top5_logprobs"]))
            check(d <= 0.03, f"{file}: greedy decode log-probs differ from the golden by {d}")


def _register(f):
    def test(ctx):
        check_family(f)
    test.__name__ = "family_" + f[len("mini-"):-len("-F16.gguf")].replace("-", "_")
    suite.test(test)


for _f in FILES:
    _register(_f)

if __name__ == "__main__":
    raise SystemExit(suite.main())
