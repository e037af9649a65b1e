#!/usr/bin/env python3
"""The importance-matrix quantizations of the mini llama through `serval
serve`: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS and
Q3_K_S/M (ik_llama.cpp's quantizer) and TQ1_0, TQ2_0 (llama.cpp's), with
llama.cpp's greedy paths and top-5 log-probs (../shared/golden/
mini-formats-iq.json) teacher-forced through /v1/completions, one request per
step (harness.teacher_forced): within mean 0.08 / max 0.4 for the 3-bit and
wider types and 0.15 / 0.8 for the 1- and 2-bit and ternary ones; our greedy
token is the golden's wherever its top-2 gap exceeds 0.2 (both sides quantize
activations to 8 bits, each its own way, so closer calls may differ). Then one
greedy request of 32 tokens per prompt runs through decode steps and answers
200."""

import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, eq, post, short, teacher_forced  # noqa: E402

suite = Suite("server_iq_formats")


def golden():
    with open(os.path.join(Config.shared, "golden", "mini-formats-iq.json")) as f:
        return json.load(f)


def check_file(file):
    cases = golden()[file]
    low_bit = any(k in file for k in ("IQ1", "IQ2", "TQ"))
    bound_mean, bound_max = (0.15, 0.8) if low_bit else (0.08, 0.4)
    model = os.path.join(Config.shared, "models", "mini", file)
    with Server("--kv-type", "f32", name=file, model=model, chat_template=False) as srv:
        mean, worst, n, gap_steps, gap_agree = teacher_forced(srv.port, cases, gap=0.2)
        print(f"{file}: teacher-forced through the server: mean |d logprob| {mean:.5f} max {worst:.5f} over {n} "
              f"values; greedy agreement {gap_agree}/{gap_steps} (gap > 0.2)")
        check(n >= 300, f"{file}: only {n} comparable values")  # of 640: fewer where tokens share a piece
        check(mean <= bound_mean, f"{file}: mean |d logprob| {mean:.5f} > {bound_mean}")
        check(worst <= bound_max, f"{file}: max |d logprob| {worst:.5f} > {bound_max}")
        check(gap_steps >= 20 and gap_agree == gap_steps,
              f"{file}: greedy token differs at {gap_steps - gap_agree} of {gap_steps} decided steps")
        for case in cases:
            body = {"prompt": case["prompt_tokens"], "max_tokens": 32, "temperature": 0, "logprobs": 1}
            r = post(srv.port, "/v1/completions", body, timeout=60)
            eq(r.status, 200, f"{file}: greedy request ({short(r.body, 300)})")
            eq(len(r.json()["choices"][0]["logprobs"]["token_logprobs"]), 32, f"{file}: 32 generated tokens")


def _register(f):
    def test(ctx):
        check_file(f)
    test.__name__ = "format_" + f[len("mini-llama-"):-len(".gguf")]
    suite.test(test)


FILES = ["mini-llama-IQ1_S.gguf", "mini-llama-IQ1_M.gguf", "mini-llama-IQ2_XXS.gguf", "mini-llama-IQ2_XS.gguf",
         "mini-llama-IQ2_S.gguf", "mini-llama-IQ3_XXS.gguf", "mini-llama-IQ3_S.gguf", "mini-llama-IQ4_XS.gguf",
         "mini-llama-Q3_K_S.gguf", "mini-llama-Q3_K_M.gguf", "mini-llama-TQ1_0.gguf", "mini-llama-TQ2_0.gguf"]
for _f in FILES:
    _register(_f)

if __name__ == "__main__":
    raise SystemExit(suite.main())
