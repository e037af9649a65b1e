#!/usr/bin/env python3
"""LoRA adapters through `serval serve` (stories260K and random adapters from
`serval gguf synth-lora`): --lora NAME=FILE[:SCALE] serves each adapter as a
model of its own (listed in /v1/models with the base as parent); a request
for it answers with the log-probs of the merged model (`serval lora merge`,
served alone) within 1e-4, and requests for the base and several adapters
running together each get what they get alone; vLLM's runtime routes
(/v1/load_lora_adapter, /v1/unload_lora_adapter, behind --lora-runtime) load
and unload adapters while requests run, losing none; bad adapters are
refused naming the tensor or key, at start (one line, non-zero exit) and at
run time (400)."""

import os
import shutil
import subprocess
import sys
import tempfile
import threading

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, check_error_body, eq, get, post, parse_metrics, run_threads, wait_in_engine  # noqa: E402

suite = Suite("server_lora")
TMP = tempfile.mkdtemp(prefix="serval-lora-test-")
BASE = os.path.join(Config.shared, "models", "stories260K.gguf")
PROMPT = "Once upon a time, there was a little"


def synth(name, *args):
    path = os.path.join(TMP, name)
    r = subprocess.run([Config.serval, "gguf", "synth-lora", "--base", BASE, "-o", path, "--std-b", "0.08", *args],
                       capture_output=True, text=True, timeout=60)
    eq(r.returncode, 0, f"synth-lora {name}: {r.stderr}")
    return path


def complete(port, model, n=8):
    r = post(port, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": n, "temperature": 0,
                                       "logprobs": 3, "ignore_eos": True})
    eq(r.status, 200, f"completion for {model} ({r})")
    ch = r.json()["choices"][0]
    return ch["text"], ch["logprobs"]["token_logprobs"]


ADAPTERS = {}


def adapters():
    if not ADAPTERS:
        ADAPTERS["a"] = synth("a.gguf", "--rank", "8", "--alpha", "16", "--seed", "1")
        ADAPTERS["b"] = synth("b.gguf", "--rank", "4", "--seed", "2", "--targets", "attn_v", "ffn_down", "output")
    return ADAPTERS


@suite.test
def adapter_answers_like_its_merged_model(_):
    ad = adapters()
    merged = os.path.join(TMP, "merged-a.gguf")
    r = subprocess.run([Config.serval, "lora", "merge", BASE, ad["a"], merged, "--scale", "0.5"],
                       capture_output=True, text=True, timeout=120)
    eq(r.returncode, 0, f"lora merge: {r.stderr}")
    check("35 matrices merged" in r.stderr, f"lora merge output: {r.stderr.strip()}")
    with Server("--kv-type", "f32", model=merged, name="merged") as m:
        want_text, want_lp = complete(m.port, None)
    with Server("--kv-type", "f32", "--lora", f"a={ad['a']}:0.5", "--lora", f"b={ad['b']}", name="lora") as srv:
        models = get(srv.port, "/v1/models").json()["data"]
        by_id = {d["id"]: d for d in models}
        check({"a", "b"} <= set(by_id), f"adapters listed: {sorted(by_id)}")
        base_id = models[0]["id"]
        eq(by_id["a"].get("parent"), base_id, "an adapter's parent is the base")
        eq(by_id["a"]["lora"]["rank"], 8, "rank listed")
        text, lp = complete(srv.port, "a")
        eq(text, want_text, "adapter a at scale 0.5 writes what its merged model writes")
        worst = max(abs(x - y) for x, y in zip(lp, want_lp))
        check(worst <= 1e-4, f"log-probs within 1e-4 of the merged model (worst {worst:.2e})")
        base_text, base_lp = complete(srv.port, base_id)
        check(base_lp != lp, "the adapter changes the output")
        # All at once (base, a, b, a, ...): each gets its solo answer.
        solo = {name: complete(srv.port, name) for name in (base_id, "a", "b")}
        order = [base_id, "a", "b"] * 4
        results = run_threads([lambda name=name: complete(srv.port, name) for name in order])
        for name, got in zip(order, results):
            eq(got, solo[name], f"{name} batched with the others")
        # Embeddings are not an adapter's; an unknown model is a 404.
        r = post(srv.port, "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})
        check_error_body(r, 404, "unknown model", code="model_not_found")
        # Runtime routes are off without --lora-runtime.
        r = post(srv.port, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": ad["b"]})
        check_error_body(r, 404, "runtime loading off", code="not_found")


@suite.test
def runtime_load_and_unload_under_load_lose_no_request(_):
    ad = adapters()
    with Server("--lora-runtime", "--engine-control", "--metrics-compat", "vllm", "--max-seqs", "8",
                name="lora-runtime") as srv:
        r = post(srv.port, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": ad["a"]})
        eq(r.status, 200, f"load ({r})")
        check("a" in {d["id"] for d in get(srv.port, "/v1/models").json()["data"]}, "listed after load")
        solo_a = complete(srv.port, "a", 24)
        # Six requests for a are in the engine (paused) when b is loaded and a
        # unloaded: each finishes with a, as it would alone.
        eq(post(srv.port, "/v1/engine/pause", {}).status, 200, "pause")
        results = []
        threads = [threading.Thread(target=lambda: results.append(complete(srv.port, "a", 24))) for _ in range(6)]
        for t in threads:
            t.start()
        try:
            check(wait_in_engine(srv.port, 6), "six requests for a in the engine")
            # The router signal names the adapter in use.
            info = parse_metrics(get(srv.port, "/metrics").body.decode())[0]["vllm:lora_requests_info"][0][0]
            eq((info["running_lora_adapters"], info["waiting_lora_adapters"], info["max_lora"]), ("a", "", "256"),
               "vllm:lora_requests_info")
            eq(post(srv.port, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": ad["b"]}).status, 200, "load b")
            eq(post(srv.port, "/v1/unload_lora_adapter", {"lora_name": "a"}).status, 200, "unload a")
        finally:
            post(srv.port, "/v1/engine/resume", {})
            for t in threads:
                t.join(60)
        eq(len(results), 6, "every request answered")
        for got in results:
            eq(got, solo_a, "a request for a, unloaded while it ran")
        r = post(srv.port, "/v1/completions", {"model": "a", "prompt": "x", "max_tokens": 1})
        check_error_body(r, 404, "an unloaded adapter", code="model_not_found")
        r = post(srv.port, "/v1/unload_lora_adapter", {"lora_name": "a"})
        check_error_body(r, 404, "unloading twice")
        # Bad bodies and bad files: 400, naming the problem.
        for body, param, needle in [
            ({"lora_name": "c"}, "lora_path", "lora_path"),
            ({"lora_name": "b", "lora_path": ad["b"]}, "lora_name", "already been loaded"),
            ({"lora_name": "c", "lora_path": BASE}, "lora_path", "general.type"),
            ({"lora_name": "c", "lora_path": "/nonexistent.gguf"}, "lora_path", "nonexistent"),
            ({"lora_name": "c", "lora_path": ad["a"], "colour": 1}, "colour", "unknown field"),
            ({"lora_name": 5, "lora_path": ad["a"]}, "lora_name", "lora_name"),
        ]:
            r = post(srv.port, "/v1/load_lora_adapter", body)
            check_error_body(r, 400, f"load {body}", param=param)
            check(needle in r.json()["error"]["message"], f"{body}: {r.json()['error']['message']!r} lacks {needle!r}")
        eq(complete(srv.port, "b")[0] != "", True, "b still serves")


@suite.test
def bad_adapters_at_start_get_one_line_errors(_):
    ad = adapters()
    qwen = os.path.join(Config.shared, "models", "mini", "mini-qwen2-Q4_K_M.gguf")
    for model, args, want in [
        (BASE, ["--lora", "x"], "expected NAME=FILE"),
        (BASE, ["--lora", f"x={BASE}"], "general.type"),
        (BASE, ["--lora", f"x={ad['a']}:1e9"], "SCALE"),
        (qwen, ["--lora", f"x={ad['a']}"], "architecture 'llama', the base model is 'qwen2'"),
    ]:
        r = subprocess.run([Config.serval, "serve", "-m", model, "--port", "0", "--no-batch", *args],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode != 0, f"{args}: exit {r.returncode}")
        check(want in r.stderr, f"{args}: stderr {r.stderr.strip()[:300]!r} lacks {want!r}")
        eq(len(r.stderr.strip().splitlines()), 1, f"{args}: one line")


if __name__ == "__main__":
    try:
        rc = suite.main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(rc)
