#!/usr/bin/env python3
"""Model switch time in router mode (docs/ROUTER.md): one `serval serve` with
two models and --models-max 1, requests alternating between them, so every
request for --model first unloads the other one and loads it. Reports, over
--rounds switches: the load time the router measured (the
serval_router_model_load_seconds gauge after each switch), the wall time of
the switching request (load + a --gen-len token completion), and the same
request once the model is loaded (the no-switch baseline), medians.
The file is read through the page cache: the first round (cold or not) is
reported on its own and left out of the medians.

Usage:
  python3 bench/router_bench.py --serval build/serval --model /tmp/models/tinyllama-q4_0.gguf \\
      [--other ../shared/models/stories260K.gguf] [--rounds 5] [--gen-len 8] [--threads 2]
  --smoke [--shared DIR]: stories260K against itself, 2 rounds (CI: the script keeps working)
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from serve_util import start_serve  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
    return data


def complete(port, model, n):
    t0 = time.perf_counter()
    call(port, "POST", "/v1/completions", {"model": model, "prompt": "Once upon a time", "max_tokens": n,
                                           "temperature": 0, "ignore_eos": True})
    return time.perf_counter() - t0


def load_seconds(port, model):
    for line in call(port, "GET", "/metrics").decode().splitlines():
        if line.startswith(f'serval_router_model_load_seconds{{model="{model}"}}'):
            return float(line.split()[-1])
    raise RuntimeError("no serval_router_model_load_seconds")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serval", default=os.path.join(HERE, "..", "build", "serval"))
    ap.add_argument("--model")
    ap.add_argument("--other")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen-len", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-memory", default="256M")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shared", default=os.path.join(HERE, "..", "..", "shared"), help="the shared test data")
    a = ap.parse_args()
    shared = os.path.join(a.shared, "models", "stories260K.gguf")
    if a.smoke:
        a.model, a.other, a.rounds, a.gen_len = a.model or shared, a.other or shared, 2, 2
    a.other = a.other or shared
    if not a.model:
        ap.error("--model is required (or --smoke)")
    cmd = [a.serval, "serve", "-m", f"target={a.model}", "-m", f"other={a.other}", "--models-max", "1",
           "--port", "0", "-t", str(a.threads), "--kv-memory", a.kv_memory, "--no-webui"]
    p, port, log = start_serve(cmd, "serval-router-bench-")
    try:
        loads, switch, warm = [], [], []
        first = None
        for i in range(a.rounds + 1):
            complete(port, "other", 1)  # evicts target
            s = complete(port, "target", a.gen_len)  # loads it
            ls = load_seconds(port, "target")
            w = complete(port, "target", a.gen_len)  # loaded: no switch
            if i == 0:
                first = (ls, s)
                continue
            loads.append(ls)
            switch.append(s)
            warm.append(w)
        size = os.path.getsize(a.model)
        print(f"model {a.model} ({size / 1e6:.0f} MB), {a.rounds} switches (+1 first, left out), "
              f"{a.threads} threads")
        print(f"first switch: load {first[0] * 1e3:.0f} ms, request {first[1] * 1e3:.0f} ms")
        print(f"load (router's measure)   median {statistics.median(loads) * 1e3:8.1f} ms  "
              f"min {min(loads) * 1e3:.1f}  max {max(loads) * 1e3:.1f}")
        print(f"request with a switch     median {statistics.median(switch) * 1e3:8.1f} ms")
        print(f"request, model loaded     median {statistics.median(warm) * 1e3:8.1f} ms")
        print(f"switch cost (difference)  median {(statistics.median(switch) - statistics.median(warm)) * 1e3:8.1f} ms;"
              f" load rate {size / statistics.median(loads) / 1e9:.2f} GB/s")
    finally:
        p.terminate()
        p.wait(30)
        os.unlink(log)


if __name__ == "__main__":
    main()
