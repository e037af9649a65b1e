#!/usr/bin/env python3
"""Router mode of `serval serve` (several models behind one server, docs/ROUTER.md):
-m NAME=FILE (repeated), --models-dir and a TOML preset (with LoRA adapters); models load on their
first request and --models-max evicts the least recently used idle one;
/v1/models lists each model's state; a request for a model gets what a
single-model server of the same file gives; memory returns after an unload
(the process's RSS); a corrupt GGUF fails only its own requests; the admin
routes need an API key; bad flags and presets are refused with one line."""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import (Config, Server, Suite, check, check_error_body, eq, get, post, parse_metrics,  # noqa: E402
                     run_threads, stream, wait_until)

suite = Suite("server_router")
TMP = tempfile.mkdtemp(prefix="serval-router-test-")


def model_path(*parts):  # Config.shared is set by suite.main()
    return os.path.join(Config.shared, "models", *parts)


class _Paths:
    STORIES = property(lambda self: model_path("stories260K.gguf"))
    LLAMA = property(lambda self: model_path("mini", "mini-llama-Q8_0.gguf"))
    QWEN = property(lambda self: model_path("mini", "mini-qwen2-Q8_0.gguf"))


P = _Paths()
KEY = {"Authorization": "Bearer router-key"}


class Router(Server):
    """`serval serve` in router mode: the model arguments come from `args`."""

    def __init__(self, *args, name="router"):
        super().__init__(*args, name=name, model=P.STORIES)

    def command(self):
        cmd = super().command()
        i = cmd.index("-m")
        del cmd[i:i + 2]
        return cmd


def greedy(port, model, prompt="Once upon a time", n=12, headers=None):
    r = post(port, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
                                       "ignore_eos": True}, headers=headers)
    eq(r.status, 200, f"completion for {model} ({r})")
    eq(r.json()["model"], model, "answered model")
    return r.json()["choices"][0]["text"]


def states(port, headers=None):
    r = get(port, "/v1/models", headers=headers)
    eq(r.status, 200, "GET /v1/models")
    return {m["id"]: m["state"] for m in r.json()["data"]}


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def one_model_text(path, prompt="Once upon a time", n=12):
    with Server(model=path, name="single") as s:
        r = post(s.port, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True})
        eq(r.status, 200, f"single-model server of {path}")
        return r.json()["choices"][0]["text"]


@suite.test
def three_models_two_loaded_requests_alternate(_):
    want = {"a": one_model_text(P.STORIES), "b": one_model_text(P.LLAMA), "c": one_model_text(P.QWEN)}
    with Router("-m", f"a={P.STORIES}", "-m", f"b={P.LLAMA}", "-m", f"c={P.QWEN}", "--models-max", "2") as r:
        eq(states(r.port), {"a": "unloaded", "b": "unloaded", "c": "unloaded"}, "states before any request")
        # Sequential, alternating: each answer is what the model's own server gives.
        for m in ["a", "b", "c", "a", "c", "b"]:
            eq(greedy(r.port, m), want[m], f"model {m} through the router")
            st = states(r.port)
            eq(st[m], "loaded", f"{m} after its request")
            check(sum(v == "loaded" for v in st.values()) <= 2, f"--models-max 2 holds: {st}")
        # After ... a, c, b: the least recently used (a) went out for b.
        eq(states(r.port), {"a": "unloaded", "b": "loaded", "c": "loaded"}, "LRU after a, c, b")
        # Concurrent requests across the three models: every one completes with its model's answer.
        fns = [(lambda m=m: greedy(r.port, m)) for m in ["a", "b", "c"] * 4]
        outs = run_threads(fns, timeout=180)
        for i, o in enumerate(outs):
            check(not isinstance(o, Exception), f"concurrent request {i}: {o!r}")
            eq(o, want[["a", "b", "c"][i % 3]], f"concurrent request {i}")
        mt, _, types = parse_metrics(get(r.port, "/metrics").body.decode())
        total = lambda name: sum(v for _, v in mt.get(name, []))  # noqa: E731
        loads, unloads = total("serval_router_model_loads_total"), total("serval_router_model_unloads_total")
        loaded = total("serval_router_model_loaded")
        check(loaded <= 2, f"loaded gauge {loaded}")
        eq(loads - unloads, loaded, "loads - unloads = models loaded now")
        check(loads >= 5, f"a load per switch in the sequential part: {loads}")
        # Each loaded model's own families once, every sample labelled by its model.
        gen = sorted(lb["model"] for lb, _ in mt["serval_generation_tokens_total"])
        eq(len(gen), int(loaded), f"one generation counter per loaded model: {gen}")
        eq(types.get("serval_generation_tokens_total"), "counter", "the family's TYPE")
        # An unknown model is a 404 model_not_found; with several models, "model" is required.
        check_error_body(post(r.port, "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1}), 404,
                         "unknown model", param="model", code="model_not_found")
        check_error_body(post(r.port, "/v1/completions", {"prompt": "x", "max_tokens": 1}), 400, "no model",
                         param="model", code="model_required")
        # Aliases from the file name work as in single-model mode.
        eq(greedy(r.port, "mini-llama-Q8_0"), want["b"], "the file's stem addresses its model")
        # Admin routes need a key on the server.
        check_error_body(post(r.port, "/v1/models/a/load", {}), 403, "admin without keys", code="admin_disabled")


@suite.test
def memory_returns_after_unload(_):
    big = os.path.join(TMP, "l160.gguf")
    g = subprocess.run([Config.serval, "gguf", "synth", "--shape", "llama-160m", "--type", "q4_0", "--vocab",
                        os.path.join(Config.shared, "tokenizer-vectors", "ggml-vocab-llama-spm.gguf"), "-o", big],
                       capture_output=True, text=True, timeout=300)
    eq(g.returncode, 0, f"gguf synth: {g.stderr}")
    size_kib = os.path.getsize(big) // 1024
    with Router("-m", f"big={big}", "-m", f"small={P.STORIES}", "--models-max", "1", "--api-key", "router-key",
                "--engine-control", "--models-load-timeout", "1") as r:
        pid = r.proc.pid
        base = rss_kib(pid)
        # The admin route waits for the load (a request waits only its 1 s, and
        # under ASan a 160M model can take longer to load).
        eq(post(r.port, "/v1/models/big/load", {}, headers=KEY).status, 200, "first load")
        greedy(r.port, "big", n=4, headers=KEY)
        loaded = rss_kib(pid)
        # Under ASan freed memory sits in its quarantine: RSS is checked on the plain build only.
        rss = not Config.sanitized
        check(not rss or loaded - base > size_kib // 2,
              f"RSS grows by the model: {base} -> {loaded} KiB (file {size_kib} KiB)")
        # The admin route: without a key 401; with it the model goes and its memory with it.
        check_error_body(post(r.port, "/v1/models/big/unload", {}), 401, "unload without a key")
        u = post(r.port, "/v1/models/big/unload", {}, headers=KEY)
        eq(u.status, 200, f"unload ({u})")
        eq(u.json()["state"], "unloaded", "unload answer")
        if rss:
            wait_until(lambda: rss_kib(pid) < loaded - size_kib // 2, 10)
            after = rss_kib(pid)
            check(loaded - after > size_kib // 2,
                  f"RSS returns after unload: {loaded} -> {after} KiB (file {size_kib} KiB)")
        # Load it again by the admin route, then a request for the other model evicts it (--models-max 1).
        l = post(r.port, "/v1/models/big/load", {}, headers=KEY)
        eq(l.status, 200, f"load ({l})")
        eq(l.json()["state"], "loaded", "load answer")
        eq(states(r.port, KEY), {"big": "loaded", "small": "unloaded"}, "after the admin load")
        greedy(r.port, "small", n=4, headers=KEY)
        eq(states(r.port, KEY), {"big": "unloaded", "small": "loaded"}, "LRU eviction under --models-max 1")
        if rss:
            _, waited = wait_until(lambda: rss_kib(pid) < loaded - size_kib // 2, 10)
            check(waited is not None, f"RSS returns after the eviction: {rss_kib(pid)} KiB (loaded {loaded})")
        # A busy model is neither unloaded (409) nor evicted: its engine is held (--engine-control) with a
        # request inside, so a request for the other model waits its 1 s and gets a 503 with Retry-After.
        eq(post(r.port, "/v1/engine/pause?model=small", {}, headers=KEY).status, 200, "pause small's engine")
        res = {}
        t = threading.Thread(target=lambda: res.setdefault("r", post(
            r.port, "/v1/completions", {"model": "small", "prompt": "Once", "max_tokens": 4}, headers=KEY)))
        t.start()
        _, waited = wait_until(lambda: get(r.port, "/v1/engine/state?model=small", headers=KEY).json()["requests"][
            "http_in_flight"] >= 1, 20)
        check(waited is not None, "the held request reached small's server")
        check_error_body(post(r.port, "/v1/models/small/unload", {}, headers=KEY), 409, "unload of a busy model",
                         code="model_busy")
        t0 = time.monotonic()
        w = post(r.port, "/v1/completions", {"model": "big", "prompt": "Once", "max_tokens": 2}, headers=KEY)
        check_error_body(w, 503, "a model that cannot load while the other is busy", code="model_loading")
        check(w.header("retry-after").isdigit(), f"Retry-After: {w.header('retry-after')!r}")
        check(0.9 <= time.monotonic() - t0 < 20, f"answered after the 1 s wait ({time.monotonic() - t0:.1f} s)")
        eq(states(r.port, KEY), {"big": "unloaded", "small": "loaded"}, "the busy model stayed")
        eq(post(r.port, "/v1/engine/resume?model=small", {}, headers=KEY).status, 200, "resume")
        t.join(60)
        eq(res["r"].status, 200, f"the held request completes ({res.get('r')})")
        eq(post(r.port, "/v1/models/small/unload", {}, headers=KEY).status, 200, "unload once idle")


@suite.test
def corrupt_file_fails_only_its_own_requests(_):
    d = os.path.join(TMP, "dir")
    os.makedirs(d, exist_ok=True)
    shutil.copy(P.STORIES, os.path.join(d, "good.gguf"))
    with open(os.path.join(d, "corrupt.gguf"), "wb") as f:
        f.write(b"GGUF" + os.urandom(4096))
    with open(P.STORIES, "rb") as src, open(os.path.join(d, "truncated.gguf"), "wb") as f:
        f.write(src.read(300000))
    with open(os.path.join(d, "notes.txt"), "w") as f:
        f.write("not a model")
    want = one_model_text(P.STORIES)
    with Router("--models-dir", d) as r:
        eq(sorted(states(r.port)), ["corrupt", "good", "truncated"], "the folder's *.gguf files by stem")
        outs = run_threads([(lambda m=m: post(r.port, "/v1/completions",
                                               {"model": m, "prompt": "Once upon a time", "max_tokens": 12,
                                                "temperature": 0, "ignore_eos": True}))
                            for m in ["good", "corrupt", "truncated", "good", "corrupt", "good"]], timeout=120)
        for i, o in enumerate(outs):
            check(not isinstance(o, Exception), f"request {i}: {o!r}")
        for i, m in enumerate(["good", "corrupt", "truncated", "good", "corrupt", "good"]):
            if m == "good":
                eq(outs[i].status, 200, f"request {i} for the good model ({outs[i]})")
                eq(outs[i].json()["choices"][0]["text"], want, f"request {i}")
            else:
                e = check_error_body(outs[i], 500, f"request {i} for {m}", param="model", code="model_load_failed")
                check(m in e["message"], f"the error names the model: {e['message']}")
        ms = {m["id"]: m for m in get(r.port, "/v1/models").json()["data"]}
        eq(ms["good"]["state"], "loaded", "good")
        for m in ("corrupt", "truncated"):
            eq(ms[m]["state"], "failed", m)
            check(isinstance(ms[m].get("error"), str) and ms[m]["error"], f"{m}: the loader's message listed")
        eq(greedy(r.port, "good"), want, "the good model still answers")


@suite.test
def preset_aliases_pinned_and_ctx(_):
    preset = os.path.join(TMP, "preset.toml")
    with open(preset, "w") as f:
        f.write(f'[stories]\npath = "{P.STORIES}"\naliases = ["tiny", "kids"]\nctx = 128\npinned = true\n\n'
                f'[llama]\npath = "{P.LLAMA}"\nkv_memory = "16M"\n')
    with Router("--models-preset", preset, "--models-max", "1", "--models-load-timeout", "2") as r:
        ms = {m["id"]: m for m in get(r.port, "/v1/models").json()["data"]}
        eq(ms["stories"]["state"], "loaded", "a pinned model is loaded at start")
        eq(ms["stories"]["aliases"], ["tiny", "kids"], "aliases listed")
        eq(ms["stories"]["max_model_len"], 128, "ctx from the preset")
        check(ms["stories"]["pinned"] is True, "pinned listed")
        r2 = post(r.port, "/v1/completions", {"model": "kids", "prompt": "Once", "max_tokens": 2})
        eq(r2.status, 200, f"an alias addresses its model ({r2})")
        eq(r2.json()["model"], "kids", "the alias is answered back")
        # A pinned model is never evicted: with --models-max 1 the other one can never load (503 at once).
        w = post(r.port, "/v1/completions", {"model": "llama", "prompt": "Once", "max_tokens": 2})
        e = check_error_body(w, 503, "a model that cannot fit next to the pinned one", code="model_does_not_fit")
        check("pinned" in e["message"], f"the error says why: {e['message']}")
        eq(states(r.port), {"stories": "loaded", "llama": "unloaded"}, "pinned stays, the other never loaded")


def synth_lora(name, *args):
    path = os.path.join(TMP, name)
    r = subprocess.run([Config.serval, "gguf", "synth-lora", "--base", P.STORIES, "-o", path, "--std-b", "0.08",
                        *args], capture_output=True, text=True, timeout=60)
    eq(r.returncode, 0, f"synth-lora {name}: {r.stderr}")
    return path


@suite.test
def preset_lora_adapters(_):
    """A model's adapters from the preset: each is a model id of its own that
    loads its base, answers what a single-model server with --lora gives, and
    is listed with the base as parent."""
    ad = synth_lora("kid.gguf", "--rank", "8", "--alpha", "16", "--seed", "1")
    preset = os.path.join(TMP, "lora.toml")
    with open(preset, "w") as f:  # a relative adapter path resolves against the preset's folder
        f.write(f'[stories]\npath = "{P.STORIES}"\nlora = ["kid=kid.gguf:0.5"]\n\n[llama]\npath = "{P.LLAMA}"\n')
    with Server("--lora", f"kid={ad}:0.5", model=P.STORIES, name="single-lora") as s:
        r = post(s.port, "/v1/completions", {"model": "kid", "prompt": "Once upon a time", "max_tokens": 12,
                                             "temperature": 0, "ignore_eos": True})
        eq(r.status, 200, f"single-model server with --lora ({r})")
        want = r.json()["choices"][0]["text"]
    base_want = one_model_text(P.STORIES)
    check(want != base_want, "the adapter changes the answer")
    with Router("--models-preset", preset, "--models-max", "1") as r:
        ms = {m["id"]: m for m in get(r.port, "/v1/models").json()["data"]}
        eq(ms["kid"]["parent"], "stories", "the adapter is listed with its base as parent")
        eq(ms["kid"]["state"], "unloaded", "in its base's state")
        eq(greedy(r.port, "kid"), want, "the adapter through the router answers as with --lora")
        eq(greedy(r.port, "stories"), base_want, "its base answers without it")
        eq(greedy(r.port, "llama"), one_model_text(P.LLAMA), "the other model")
        eq(greedy(r.port, "kid"), want, "the adapter again, after its base was evicted and reloaded")
        eq(states(r.port), {"stories": "loaded", "kid": "loaded", "llama": "unloaded"}, "states with the adapter")


@suite.test
def bad_router_flags_one_line(_):
    bad = os.path.join(TMP, "bad.toml")
    cases = [
        (["-m", "x=/nonexistent.gguf"], "no such file"),
        (["--models-dir", "/nonexistent-dir"], "not a folder"),
        (["-m", f"x={P.STORIES}", "-m", f"x={P.LLAMA}"], "two models are named 'x'"),
        (["-m", f"x={P.STORIES}", "--lora", f"a={P.STORIES}"], "--lora is not available in router mode"),
        (["-m", P.STORIES, "--models-max", "2"], "are for router mode"),
    ]
    for body, args_want in [('[m]\npath = "x.gguf"\nbogus = 1\n', "unknown setting"),
                            ('[m]\nctx = -5\npath = "a"\n', "ctx"),
                            ('[m]\naliases = "x"\n', "aliases"),
                            ('[m = \n', "bad.toml"),
                            (f'[m]\npath = "{P.STORIES}"\nlora = ["a=/nonexistent.gguf"]\n', "no such file"),
                            (f'[m]\npath = "{P.STORIES}"\nlora = ["a"]\n', "expected NAME=FILE"),
                            (f'[m]\npath = "{P.STORIES}"\nlora = ["m=/etc/hostname"]\n', "given to two models")]:
        cases.append((["--models-preset", bad], args_want, body))
    for case in cases:
        args, want = case[0], case[1]
        if len(case) > 2:
            with open(bad, "w") as f:
                f.write(case[2])
        p = subprocess.run([Config.serval, "serve", *args, "--port", "0", "--no-batch"], capture_output=True,
                           text=True, timeout=60)
        check(p.returncode != 0, f"{args}: should fail")
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        eq(len(lines), 1, f"{args}: one line ({p.stderr!r})")
        check(want in lines[0], f"{args}: '{want}' in {lines[0]!r}")


if __name__ == "__main__":
    try:
        suite.main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
