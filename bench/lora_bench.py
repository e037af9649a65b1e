#!/usr/bin/env python3
"""Mixed-adapter batching (docs/LORA.md): aggregate decode throughput of
--streams concurrent streams spread over --adapters LoRA adapters against
the same streams all on the base model, on one `serval serve` holding every
adapter (so both modes run in the same process, interleaved A B A B over
--rounds). Each stream sends a short prompt and generates --gen-len tokens
(ignore_eos); throughput = completion tokens / wall time of the round.

Usage:
  python3 bench/lora_bench.py --serval build/serval --model /tmp/models/tinyllama-q4_0.gguf \\
      [--adapters 8] [--rank 16] [--streams 16] [--gen-len 64] [--rounds 3] [--threads 2]
      [--targets attn_q,attn_k,attn_v,attn_output]
  --smoke: stories260K, 2 adapters, 4 streams (CI: the script keeps working)
"""

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from serve_util import start_serve  # noqa: E402


def one(port, model, prompt, gen_len, out, i):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = {"prompt": prompt, "max_tokens": gen_len, "temperature": 0, "ignore_eos": True}
    if model:
        body["model"] = model
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{model}: {r.status} {data[:300]!r}")
    out[i] = json.loads(data)["usage"]["completion_tokens"]


def round_tps(port, models, prompts, gen_len):
    out = [0] * len(models)
    threads = [threading.Thread(target=one, args=(port, m, prompts[i], gen_len, out, i)) for i, m in enumerate(models)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    if sum(out) != len(models) * gen_len:
        raise RuntimeError(f"expected {len(models) * gen_len} tokens, got {sum(out)}")
    return sum(out) / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serval", default="build/serval")
    ap.add_argument("--model", default="/tmp/models/tinyllama-q4_0.gguf")
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--targets", default="", help="matrices to adapt (synth-lora --targets; default: all but output)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    a = ap.parse_args()
    if a.smoke:
        a.model = os.path.join(a.shared, "models", "stories260K.gguf")
        a.adapters, a.rank, a.streams, a.gen_len, a.rounds = 2, 4, 4, 8, 1
    tmp = tempfile.mkdtemp(prefix="serval-lora-bench-")
    srv = None
    try:
        lora_args = []
        for k in range(a.adapters):
            path = os.path.join(tmp, f"a{k}.gguf")
            subprocess.run([a.serval, "gguf", "synth-lora", "--base", a.model, "-o", path, "--rank", str(a.rank),
                            "--alpha", str(2 * a.rank), "--seed", str(k + 1), "--type", "f16",
                            *(["--targets", *a.targets.split(",")] if a.targets else [])],
                           check=True, capture_output=True)
            lora_args += ["--lora", f"a{k}={path}"]
        cmd = [a.serval, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads), "--no-batch",
               "--max-seqs", str(a.streams), "--no-prefix-caching", *lora_args]
        srv, port, _ = start_serve(cmd, "serval-lora-bench-")
        prompts = [[1] + [100 + 7 * i + j for j in range(15)] for i in range(a.streams)]
        base = [None] * a.streams
        mixed = [f"a{i % a.adapters}" for i in range(a.streams)]
        round_tps(port, base, prompts, min(a.gen_len, 8))  # warm-up
        got = {"base": [], "mixed": []}
        for _ in range(a.rounds):
            got["base"].append(round_tps(port, base, prompts, a.gen_len))
            got["mixed"].append(round_tps(port, mixed, prompts, a.gen_len))
        b, m = statistics.median(got["base"]), statistics.median(got["mixed"])
        print(f"# {a.streams} streams x {a.gen_len} tokens, {a.adapters} adapters of rank {a.rank} "
              f"(f16; {a.targets or 'all but output'}), {a.threads} threads, model {a.model}, "
              f"{a.rounds} rounds interleaved")
        print(f"base only        : {b:8.1f} tokens/s (rounds {', '.join(f'{x:.1f}' for x in got['base'])})")
        print(f"mixed adapters   : {m:8.1f} tokens/s (rounds {', '.join(f'{x:.1f}' for x in got['mixed'])})")
        print(f"mixed / base     : {m / b:8.3f}")
    finally:
        if srv:
            srv.terminate()
            srv.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
