#!/usr/bin/env python3
"""Embeddings throughput, side by side: `serval serve` and llama.cpp's
`llama-server --embeddings` on the same GGUF file (docs/EMBEDDINGS.md).

Both servers run at once (each idle while the other is measured), with the
same thread count. Each round measures every (server, batch size) pair in turn,
interleaved (A B A B ...), so that drift on a noisy machine hits both alike:
one client sends --requests requests of B inputs each to /v1/embeddings and
waits for each answer; inputs/s = B x requests / wall time, tokens/s from the
usage the server reports. Inputs are random English-like word sequences of
--words words (different in every request: nothing is cached). Prints every
run, the medians and serval / llama.cpp ratios.

Usage:
  python3 bench/embed_compare.py --serval build/serval --model /tmp/models/bert-base-f16.gguf \\
      [--llama-server ../peer/llama.cpp/build/bin/llama-server] [--batches 1,16,64] [--words 48] \\
      [--requests 8] [--rounds 5] [--threads 2]
  --smoke: serval only, bert-tiny written to a temp dir, 1 round (CI checks that the script works)
"""

import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

WORDS = ("the of and to in is was for on that with as by at from this it be are an or which his her their "
         "model server memory cache token vector search query document index score rank batch thread core "
         "river mountain city music garden window paper light stone water winter summer morning evening").split()


def post(port, path, body, timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"POST {path}: {r.status} {data[:300]!r}")
        return json.loads(data)
    finally:
        conn.close()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, name, cmd, port):
        self.name, self.cmd, self.port = name, cmd, port
        self.log = tempfile.NamedTemporaryFile(prefix=f"embed-bench-{name}-", suffix=".log", delete=False)
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{name} exited: {open(self.log.name).read()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not come up: {open(self.log.name).read()[-2000:]}")

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
        os.unlink(self.log.name)


def texts(rng, n, words):
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def measure(port, batch, requests, words, rng):
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(requests):
        r = post(port, "/v1/embeddings", {"input": texts(rng, batch, words), "encoding_format": "float"})
        if len(r["data"]) != batch:
            raise RuntimeError(f"{len(r['data'])} embeddings for {batch} inputs")
        tokens += r["usage"]["prompt_tokens"]
    dt = time.perf_counter() - t0
    return batch * requests / dt, tokens / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serval", default="build/serval")
    ap.add_argument("--llama-server", default="")
    ap.add_argument("--model", default="")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--words", type=int, default=48)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    tmp = None
    if a.smoke:
        tmp = tempfile.mkdtemp(prefix="embed-bench-")
        a.model = os.path.join(tmp, "bert-tiny.gguf")
        subprocess.run([a.serval, "gguf", "synth", "--shape", "bert-tiny", "--type", "f16", "-o", a.model, "--vocab",
                        os.path.join(a.shared, "tokenizer-vectors", "ggml-vocab-bert-bge.gguf")], check=True,
                       capture_output=True)
        a.llama_server, a.rounds, a.requests, a.words, batches = "", 1, 2, 16, [1, 4]
    if not a.model:
        sys.exit("--model is required (or --smoke)")
    max_batch = max(batches)
    procs = []
    try:
        port = free_port()
        procs.append(Proc("serval", [a.serval, "serve", "-m", a.model, "--port", str(port), "-t", str(a.threads),
                                     "--no-batch", "--max-batch-tokens", "4096", "--max-seqs", "256",
                                     "--max-queue-tokens", str(1 << 30)], port))
        if a.llama_server:
            port = free_port()
            # One slot per input of the largest batch, each with the model's 512 positions, and
            # batches large enough to take a whole request in one decode (llama.cpp's best case).
            ctx = 512 * max_batch
            procs.append(Proc("llama.cpp", [a.llama_server, "-m", a.model, "--embeddings", "--port", str(port),
                                            "-t", str(a.threads), "-tb", str(a.threads), "-np", str(max_batch),
                                            "-c", str(ctx), "-b", "8192", "-ub", "8192"], port))
        rng = random.Random(1234)
        for p in procs:  # warm-up
            measure(p.port, 2, 1, a.words, rng)
        results = {}  # (name, batch) -> [(inputs/s, tokens/s)]
        for rnd in range(a.rounds):
            for b in batches:
                for p in procs:
                    ips, tps = measure(p.port, b, a.requests, a.words, rng)
                    results.setdefault((p.name, b), []).append((ips, tps))
                    print(f"round {rnd + 1} {p.name:9s} batch {b:3d}: {ips:8.1f} inputs/s {tps:9.0f} tokens/s",
                          flush=True)
        print(f"\nmedians of {a.rounds} rounds, {a.requests} requests each, {a.words} words per input, "
              f"{a.threads} threads, {os.path.basename(a.model)}")
        print(f"{'batch':>5} " + " ".join(f"{p.name + ' in/s':>16} {p.name + ' tok/s':>16}" for p in procs) +
              ("  serval/llama.cpp" if len(procs) > 1 else ""))
        for b in batches:
            row = f"{b:5d} "
            med = {}
            for p in procs:
                runs = results[(p.name, b)]
                med[p.name] = statistics.median(r[0] for r in runs)
                row += f"{med[p.name]:16.1f} {statistics.median(r[1] for r in runs):16.0f} "
            if len(procs) > 1:
                row += f"  {med['serval'] / med['llama.cpp']:.2f}x"
            print(row)
    finally:
        for p in procs:
            p.stop()
        if tmp:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
