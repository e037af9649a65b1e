#!/usr/bin/env python3
"""Batch API throughput and its effect on interactive latency (docs/BATCH.md).

Each round, interleaved so that drift on a noisy machine hits both alike:
  1. `serval bench throughput` at --concurrency C with the same prompt and
     generation lengths: the engine's throughput without the API (baseline),
     run before and after step 2 and averaged (the machine drifts);
  2. one `serval serve --batch-concurrency C`: first an idle interactive probe
     (--probes sequential streaming requests: TTFT), then a --lines batch
     uploaded through the Files API; while it runs, the same interactive
     probe again (1 stream of interactive load); the batch's generated tokens
     / wall time (create -> completed) is its throughput.
Prints every run, the medians and the ratios: batch / bench throughput, and
interactive TTFT p50 under the batch / idle.

Prompts are random token ids (no prefix-cache hits), each line and each probe
generates exactly --gen-len tokens (ignore_eos).

Usage:
  python3 bench/batch_bench.py --serval build/serval --model /tmp/models/tinyllama-q4_0.gguf \\
      [--lines 1000] [--concurrency 8] [--prompt-len 64] [--gen-len 64] [--threads 2] [--rounds 1]
  --smoke: a few lines on stories260K, to check that the script works (CI)
"""

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from serve_util import start_serve  # noqa: E402


def request(port, method, path, body=None, headers=None, timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data) if "json" in (r.getheader("Content-Type") or "") else data
    finally:
        conn.close()


def ttft(port, prompt_ids, gen_len):
    """Seconds from sending a streaming request to its first token's bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": prompt_ids, "max_tokens": gen_len, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"probe: {r.status} {r.read()[:300]!r}")
    first = None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        if first is None and b'"text":"' in buf.replace(b'"text":""', b""):
            first = time.monotonic() - t0
        if b"[DONE]" in buf:
            break
    conn.close()
    return first


def rand_prompt(rng, n, vocab):
    return [rng.randrange(100, vocab) for _ in range(n)]


def start_server(a, batch_dir):
    cmd = [a.serval, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads), "--kv-memory", a.kv_memory,
           "--batch-dir", batch_dir, "--batch-concurrency", str(a.concurrency)]
    return start_serve(cmd, "batch-bench-", timeout=120)


def upload(port, content):
    boundary = "----bb" + uuid.uuid4().hex
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="bench.jsonl"\r\n\r\n').encode()
    body += content.encode() + f"\r\n--{boundary}--\r\n".encode()
    return request(port, "POST", "/v1/files", body=body,
                   headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})


def bench_throughput(a):
    cmd = [a.serval, "bench", "throughput", "-m", a.model, "--requests", str(a.bench_requests), "--concurrency",
           str(a.concurrency), "--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len), "-t", str(a.threads),
           "--kv-memory", a.kv_memory, "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(p.stdout.strip().splitlines()[-1])["gen_tok_s"])


def batch_round(a, rng, vocab):
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as d:
        p, port, log = start_server(a, d)
        try:
            idle = [ttft(port, rand_prompt(rng, a.prompt_len, vocab), a.gen_len) for _ in range(a.probes)]
            lines = []
            for i in range(a.lines):
                lines.append(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/completions",
                                         "body": {"prompt": rand_prompt(rng, a.prompt_len, vocab),
                                                  "max_tokens": a.gen_len, "temperature": 0, "ignore_eos": True}}))
            f = upload(port, "\n".join(lines) + "\n")
            t0 = time.monotonic()
            b = request(port, "POST", "/v1/batches",
                        {"input_file_id": f["id"], "endpoint": "/v1/completions", "completion_window": "24h"})
            # Let the batch reach its steady state, then probe under it.
            while request(port, "GET", f"/v1/batches/{b['id']}")["request_counts"]["completed"] < a.concurrency:
                time.sleep(0.2)
            loaded = [ttft(port, rand_prompt(rng, a.prompt_len, vocab), a.gen_len) for _ in range(a.probes)]
            probe_end = time.monotonic()
            while True:
                s = request(port, "GET", f"/v1/batches/{b['id']}")
                if s["status"] in ("completed", "failed", "cancelled", "expired"):
                    break
                time.sleep(0.2)
            wall = time.monotonic() - t0
            print(f"  batch {s['status']} in {wall:.1f} s: {s['request_counts']}; TTFT idle {idle}, loaded {loaded}",
                  flush=True)
            if s["status"] != "completed" or s["request_counts"]["completed"] != a.lines:
                raise RuntimeError(f"batch ended {s['status']}: {s['request_counts']}")
            out = request(port, "GET", f"/v1/files/{s['output_file_id']}/content").decode()
            tokens = sum(json.loads(x)["response"]["body"]["usage"]["completion_tokens"] for x in out.split("\n") if x)
            return {"batch_tok_s": tokens / wall, "wall_s": wall, "tokens": tokens,
                    "probe_s": probe_end - t0, "idle_ttft": idle, "loaded_ttft": loaded}
        finally:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            os.unlink(log)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serval", default="build/serval")
    ap.add_argument("--model", default="")
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-memory", default="256M")
    ap.add_argument("--probes", type=int, default=15)
    ap.add_argument("--bench-requests", type=int, default=0, help="bench throughput requests (default: --lines / 4)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    if a.smoke:
        a.model = a.model or os.path.join(here, "..", "..", "shared", "models", "stories260K.gguf")
        a.lines, a.probes, a.gen_len, a.prompt_len, a.concurrency, a.threads = 24, 3, 16, 16, 4, 1
    if not a.model:
        ap.error("--model is required (or --smoke)")
    a.bench_requests = a.bench_requests or max(a.concurrency * 2, a.lines // 4)
    vocab = 32000 if not a.smoke else 512
    rng = random.Random(a.seed)
    print(f"batch bench: {a.model}, {a.lines} lines x ({a.prompt_len} prompt + {a.gen_len} generated tokens), "
          f"concurrency {a.concurrency}, -t {a.threads}, {a.rounds} round(s)", flush=True)
    base, rounds = [], []
    for k in range(a.rounds):
        # The baseline brackets the batch run (before and after, averaged): the
        # machine drifts over a batch run's minutes.
        before = bench_throughput(a)
        print(f"round {k + 1}: bench throughput {before:.1f} gen tok/s (before)", flush=True)
        r = batch_round(a, rng, vocab)
        after = bench_throughput(a)
        print(f"round {k + 1}: bench throughput {after:.1f} gen tok/s (after)", flush=True)
        base.append((before + after) / 2)
        rounds.append(r)
        print(f"round {k + 1}: batch {r['batch_tok_s']:.1f} gen tok/s ({r['tokens']} tokens in {r['wall_s']:.1f} s; "
              f"probes ran in the first {r['probe_s']:.1f} s) | interactive TTFT p50 idle "
              f"{statistics.median(r['idle_ttft']) * 1000:.0f} ms, under the batch "
              f"{statistics.median(r['loaded_ttft']) * 1000:.0f} ms", flush=True)
    b_med = statistics.median(base)
    t_med = statistics.median(r["batch_tok_s"] for r in rounds)
    idle = statistics.median(statistics.median(r["idle_ttft"]) for r in rounds)
    loaded = statistics.median(statistics.median(r["loaded_ttft"]) for r in rounds)
    paired = statistics.median(r["batch_tok_s"] / b for r, b in zip(rounds, base))
    print(f"median: batch {t_med:.1f} / bench throughput {b_med:.1f} gen tok/s = {t_med / b_med:.3f} "
          f"(paired per round {paired:.3f}); TTFT p50 under the batch / idle = {loaded * 1000:.0f} / {idle * 1000:.0f} ms "
          f"= {loaded / idle:.2f}x")
    if a.smoke and not (t_med > 0 and idle > 0 and loaded > 0):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
