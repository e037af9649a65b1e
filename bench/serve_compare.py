#!/usr/bin/env python3
"""Side-by-side serving figures: `serval serve` against peer servers.

Each round starts every server in turn on the same GGUF file (serval first,
then each peer), drives it with `serval bench http` (the same closed-loop
client for every server: C clients, N requests of P prompt / G generated
tokens, `ignore_eos`, two warm-up requests, the same prompts), stops it, and
goes on to the next, so the engines alternate on the shared machine. Prints
per engine the median over rounds of the aggregate generated tokens/s, TTFT
p50/p99 and inter-token latency p50, and serval's ratios to each peer
(throughput: serval / peer; TTFT: serval / peer, lower is better).

  python3 bench/serve_compare.py --serval build/serval --model /tmp/models/tinyllama-q4_0.gguf \\
      --peer "ik=../peer/ik/build/bin/llama-server -m {model} --port {port} -t {threads} -np 16 -c 4096" \\
      -c 16 -n 48 --prompt-len 64 --gen-len 64 -t 2 --rounds 3

A peer is NAME=COMMAND, a server command line with {model}, {port} and
{threads} filled in; it must serve /v1/models and /v1/completions (llama.cpp's
and ik_llama.cpp's llama-server do). `--smoke` (CI) runs serval against a
second serval on stories260K with tiny sizes and checks every figure.
"""

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_peer(text):
    name, sep, cmd = text.partition("=")
    if not sep or not name or not cmd.strip():
        raise SystemExit(f"serve_compare.py: --peer {text!r}: expected NAME=COMMAND")
    for key in ("{model}", "{port}"):
        if key not in cmd:
            raise SystemExit(f"serve_compare.py: --peer {name}: the command needs {key}")
    return name, cmd


def wait_ready(port, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(0.5)
    return False


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_one(args, name, cmd_template, log_dir):
    """Starts one server, benchmarks it, stops it; returns bench http's JSON or None."""
    port = free_port()
    cmd = cmd_template.format(model=args.model, port=port, threads=args.t)
    log = open(os.path.join(log_dir, f"{name}.log"), "ab")
    proc = subprocess.Popen(shlex.split(cmd), stdout=log, stderr=subprocess.STDOUT)
    try:
        if not wait_ready(port, proc, args.start_timeout):
            print(f"  {name}: server did not come up (log: {log.name})", file=sys.stderr)
            return None
        bench = [args.serval, "bench", "http", "--url", f"http://127.0.0.1:{port}", "-c", str(args.c), "-n",
                 str(args.n), "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len), "--warmup", "2",
                 "--no-calibrate", "-o", "json"]
        res = subprocess.run(bench, capture_output=True, text=True, timeout=args.timeout)
        if res.returncode != 0:
            print(f"  {name}: bench http exited {res.returncode}: {res.stderr.strip()[-300:]}", file=sys.stderr)
            return None
        return json.loads(res.stdout)
    finally:
        stop(proc)
        log.close()


FIELDS = [("gen_tok_s", "gen tok/s"), ("ttft_p50_s", "TTFT p50 s"), ("ttft_p99_s", "TTFT p99 s"),
          ("itl_p50_s", "ITL p50 s")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serval", default=os.path.join(ROOT, "build", "serval"))
    ap.add_argument("--serval-args", default="", help="extra `serval serve` flags")
    ap.add_argument("--model")
    ap.add_argument("--peer", action="append", default=[], help="NAME=COMMAND with {model} {port} {threads}")
    ap.add_argument("-c", type=int, default=16, help="concurrent clients")
    ap.add_argument("-n", type=int, default=48, help="requests per run")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("-t", type=int, default=2, help="threads for every server")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per benchmark run")
    ap.add_argument("--start-timeout", type=float, default=120, help="seconds for a server to come up")
    ap.add_argument("--log-dir", default="/tmp", help="server logs go here")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--smoke", action="store_true", help="CI: serval against a second serval on stories260K")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    args = ap.parse_args()
    if args.smoke:
        args.model = os.path.join(args.shared, "models", "stories260K.gguf")
        args.peer = [f"serval2={shlex.quote(args.serval)} serve -m {{model}} --port {{port}} -t {{threads}}"]
        args.c, args.n, args.prompt_len, args.gen_len, args.t, args.rounds = 4, 8, 16, 8, 1, 2
    if not args.model or not os.path.isfile(args.model):
        raise SystemExit(f"serve_compare.py: --model {args.model!r}: no such file")
    for v, flag in ((args.c, "-c"), (args.n, "-n"), (args.prompt_len, "--prompt-len"), (args.gen_len, "--gen-len"),
                    (args.t, "-t"), (args.rounds, "--rounds")):
        if v < 1:
            raise SystemExit(f"serve_compare.py: {flag} must be >= 1")
    peers = [parse_peer(p) for p in args.peer]
    if not peers:
        raise SystemExit("serve_compare.py: give at least one --peer")
    engines = [("serval", f"{shlex.quote(args.serval)} serve -m {{model}} --port {{port}} -t {{threads}} "
                          f"{args.serval_args}")] + peers
    os.makedirs(args.log_dir, exist_ok=True)

    runs = {name: [] for name, _ in engines}
    for r in range(1, args.rounds + 1):
        for name, cmd in engines:
            res = run_one(args, name, cmd, args.log_dir)
            if res is None or res.get("completed", 0) != args.n:
                raise SystemExit(f"serve_compare.py: {name} failed in round {r}")
            runs[name].append(res)
            print(f"round {r} {name}: " + "  ".join(f"{label} {res[key]:.4g}" for key, label in FIELDS), flush=True)

    med = {name: {key: statistics.median(x[key] for x in runs[name]) for key, _ in FIELDS} for name in runs}
    print(f"# {os.path.basename(args.model)}: {args.c} clients, {args.n} requests of {args.prompt_len} + "
          f"{args.gen_len} tokens, -t {args.t}, {args.rounds} interleaved rounds, medians")
    print("| engine | " + " | ".join(label for _, label in FIELDS) + " | serval tok/s ratio | serval TTFT p50 ratio |")
    print("|---|" + "---|" * (len(FIELDS) + 2))
    out = {"model": args.model, "engines": {}}
    for name, _ in engines:
        m = med[name]
        tput = med["serval"]["gen_tok_s"] / m["gen_tok_s"] if m["gen_tok_s"] > 0 else float("nan")
        ttft = med["serval"]["ttft_p50_s"] / m["ttft_p50_s"] if m["ttft_p50_s"] > 0 else float("nan")
        print(f"| {name} | " + " | ".join(f"{m[key]:.4g}" for key, _ in FIELDS) +
              (" | — | — |" if name == "serval" else f" | {tput:.2f}× | {ttft:.2f}× |"))
        out["engines"][name] = {"median": m, "runs": runs[name], "throughput_ratio": tput, "ttft_p50_ratio": ttft}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.smoke:
        for name, e in out["engines"].items():
            m = e["median"]
            if not (m["gen_tok_s"] > 0 and 0 < m["ttft_p50_s"] <= m["ttft_p99_s"] and m["itl_p50_s"] > 0):
                raise SystemExit(f"serve_compare.py --smoke: bad figures for {name}: {m}")
        print("serve_compare.py --smoke: ok")


if __name__ == "__main__":
    main()
