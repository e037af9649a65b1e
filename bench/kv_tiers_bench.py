#!/usr/bin/env python3
"""KV cache tiers on a multi-turn chat workload (docs/KV_TIERS.md).

--conversations chats of --turns turns each. Every turn resends the whole
conversation so far plus --turn-tokens new tokens (random token ids: the
user's message and the previous answer) and generates --gen-len tokens; the
conversations take turns round-robin from --concurrency clients, so a
conversation comes back only after all the others had a turn. The KV pool
holds --pool-contexts full contexts, far fewer than the conversations, so
without tiers nearly every turn prefills its whole context again.

Modes, each on a fresh `serval serve` (interleaved over --rounds):
  off       no tiers (the pool's own prefix cache only)
  ram       --kv-cache-ram big enough for every conversation
  ram+disk  --kv-cache-ram for --ram-contexts contexts, the rest on disk
Prints TTFT p50 / p99 per mode and the ratio against `off`, and, for
ram+disk, a restart: the server is stopped (SIGTERM: it writes its cache
out) and started again on the same --kv-cache-dir, and the next turn of one
conversation is timed (restart-to-first-hit TTFT) against the same turn cold.

Usage:
  python3 bench/kv_tiers_bench.py --serval build/serval --model /tmp/models/tinyllama-q4_0.gguf \\
      [--conversations 20] [--turns 8] [--turn-tokens 375] [--gen-len 16] [--pool-contexts 4] [--threads 2]
  --smoke: stories260K, 4 conversations x 3 turns (CI: the script keeps working)
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from serve_util import start_serve  # noqa: E402


def ttft(port, prompt_ids, gen_len):
    """Seconds from sending a streaming request to its first token event."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = json.dumps({"prompt": prompt_ids, "max_tokens": gen_len, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"turn: {r.status} {r.read()[:300]!r}")
    first = None
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        if first is None and b'"choices"' in buf:
            first = time.monotonic() - t0
        if b"[DONE]" in buf:
            break
    conn.close()
    return first


def get_json(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return json.loads(data)


def start_server(a, extra):
    cmd = [a.serval, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads), "--no-batch", "-c", str(a.ctx),
           "--kv-memory", str(a.pool_bytes), "--max-seqs", str(max(4, a.concurrency)), *extra]
    return start_serve(cmd, "kv-tiers-bench-", timeout=300)


def stop_server(p, log):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    os.unlink(log)


def conversations(a, seed):
    rng = random.Random(seed)
    # One turn more than the workload runs: the restart probe's.
    return [[[rng.randrange(100, a.vocab) for _ in range(a.turn_tokens)] for _ in range(a.turns + 1)]
            for _ in range(a.conversations)]


def run_workload(a, port, convs, turns=None):
    """All turns, conversations round-robin, from a.concurrency clients. Returns TTFTs."""
    turns = turns if turns is not None else range(a.turns)
    jobs = [(t, c) for t in turns for c in range(len(convs))]
    out, lock = [], threading.Lock()
    nxt = [0]
    done_turn = [[-1] * len(convs)]
    cond = threading.Condition(lock)

    def client():
        while True:
            with cond:
                if nxt[0] >= len(jobs):
                    return
                t, c = jobs[nxt[0]]
                nxt[0] += 1
                # A conversation's next turn waits for its previous one (a user reads the answer first).
                while done_turn[0][c] < t - 1 and t > turns[0]:
                    cond.wait()
            prompt = [1] + [tok for k in range(t + 1) for tok in convs[c][k]]
            s = ttft(port, prompt, a.gen_len)
            with cond:
                out.append((t, c, len(prompt), s))
                done_turn[0][c] = t
                cond.notify_all()

    errors = []

    def guarded():
        try:
            client()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            with cond:
                nxt[0] = len(jobs)  # the other clients stop too
                cond.notify_all()

    ths = [threading.Thread(target=guarded) for _ in range(a.concurrency)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    if errors:
        raise errors[0]
    return out


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serval", default="build/serval")
    ap.add_argument("--model", default="/tmp/models/tinyllama-q4_0.gguf")
    ap.add_argument("--conversations", type=int, default=20)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-tokens", type=int, default=375)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--pool-contexts", type=float, default=4)
    ap.add_argument("--ram-contexts", type=float, default=8, help="RAM tier of the ram+disk mode")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default="off,ram,ram+disk")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    a = ap.parse_args()
    if a.smoke:
        a.model = os.path.join(a.shared, "models", "stories260K.gguf")
        a.conversations, a.turns, a.turn_tokens, a.gen_len, a.pool_contexts, a.ram_contexts, a.vocab = \
            4, 3, 64, 4, 1.5, 2, 500

    # KV bytes per token from the server itself.
    a.pool_bytes = 64 << 20
    # The context a conversation reaches (the restart probe's turn included).
    a.ctx = 1 + (a.turns + 1) * a.turn_tokens + a.gen_len
    p, port, log = start_server(a, [])
    bpt = get_json(port, "/v1/engine/state")["kv_cache"]["bytes_per_token"]
    stop_server(p, log)
    ctx = a.ctx
    a.pool_bytes = int(a.pool_contexts * ctx * bpt)
    all_bytes = int(a.conversations * ctx * bpt * 1.1) + (1 << 20)
    ram_bytes = int(a.ram_contexts * ctx * bpt)
    print(f"# {a.conversations} conversations x {a.turns} turns of {a.turn_tokens} tokens (+{a.gen_len} generated), "
          f"last context {ctx} tokens; KV {bpt} bytes/token; pool {a.pool_bytes >> 20} MiB "
          f"({a.pool_contexts} contexts), concurrency {a.concurrency}, {a.threads} threads; model {a.model}")

    results = {m: [] for m in a.modes.split(",")}
    restart = []
    for rnd in range(a.rounds):
        convs = conversations(a, 1000 + rnd)
        for mode in results:
            tmp = tempfile.mkdtemp(prefix="kv-tiers-bench-")
            try:
                extra = []
                if mode == "ram":
                    extra = ["--kv-cache-ram", str(all_bytes)]
                elif mode == "ram+disk":
                    extra = ["--kv-cache-ram", str(ram_bytes), "--kv-cache-dir", tmp,
                             "--kv-cache-disk", str(all_bytes)]
                elif mode != "off":
                    raise SystemExit(f"unknown mode {mode}")
                p, port, log = start_server(a, extra)
                t0 = time.monotonic()
                out = run_workload(a, port, convs, list(range(a.turns)))
                wall = time.monotonic() - t0
                st = get_json(port, "/v1/engine/state")
                stop_server(p, log)
                xs = [s for (t, _, _, s) in out if t > 0]  # turns after the first (they have a prefix to reuse)
                results[mode].append((pct(xs, 0.5), pct(xs, 0.99), wall))
                tiers = st.get("kv_tiers", {})
                print(f"round {rnd} {mode:9s} TTFT p50 {pct(xs, 0.5):7.3f} s  p99 {pct(xs, 0.99):7.3f} s  "
                      f"({len(xs)} turns after the first, wall {wall:.0f} s)  prefix hit rate "
                      f"{st['prefix_cache']['hit_rate']:.2f}; tier hits ram {tiers.get('ram', {}).get('hits', 0)} "
                      f"disk {tiers.get('disk', {}).get('hits', 0)}", flush=True)
                if mode == "ram+disk":
                    # Restart on the same directory; the next turn of conversation 0 is the first request.
                    p, port, log = start_server(a, extra)
                    warm = run_workload(a, port, convs[:1], [a.turns])[0][3]
                    st = get_json(port, "/v1/engine/state")
                    stop_server(p, log)
                    p, port, log = start_server(a, [])
                    cold = run_workload(a, port, convs[:1], [a.turns])[0][3]
                    stop_server(p, log)
                    restart.append((warm, cold))
                    print(f"round {rnd} restart   first request TTFT {warm:.3f} s (disk hits "
                          f"{st['kv_tiers']['disk']['hits']}, recovered {st['kv_tiers']['disk']['recovered']} files) "
                          f"vs cold {cold:.3f} s", flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    print("\n| mode | TTFT p50 (s) | TTFT p99 (s) | p50 vs off | p99 vs off |")
    print("|---|---|---|---|---|")
    base = results.get("off")
    b50 = statistics.median(r[0] for r in base) if base else None
    b99 = statistics.median(r[1] for r in base) if base else None
    for mode, rs in results.items():
        m50 = statistics.median(r[0] for r in rs)
        m99 = statistics.median(r[1] for r in rs)
        r50 = f"{b50 / m50:.2f}x lower" if b50 else "-"
        r99 = f"{b99 / m99:.2f}x lower" if b99 else "-"
        print(f"| {mode} | {m50:.3f} | {m99:.3f} | {r50} | {r99} |")
    if restart:
        w = statistics.median(x[0] for x in restart)
        c = statistics.median(x[1] for x in restart)
        print(f"\nrestart-to-first-hit TTFT: {w:.3f} s vs cold {c:.3f} s ({c / w:.2f}x lower)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
