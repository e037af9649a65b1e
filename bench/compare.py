#!/usr/bin/env python3
"""Side-by-side decode/prefill figures: serval against peer llama-bench builds.

Runs `serval bench model` and each peer's `llama-bench` on the same GGUF files,
interleaved (round r: serval, peer 1, peer 2, ... for every file), measures the
machine's memory read bandwidth with `serval_roofline` before and after, and
prints per file and test the median t/s of every engine, serval's ratio to each
peer and to the best peer, and, for generation, the share of the bandwidth
bound (file bytes x tokens/s against the measured read bandwidth: a decode
step reads every weight once, so the file size is the bytes per token up to
the embedding rows and the KV cache; for a mixture-of-experts file, only
expert_used_count / expert_count of the expert tensors count).

  python3 bench/compare.py --serval build/serval \\
      --peer ik=../peer/ik/build/bin/llama-bench \\
      --peer "ik-rtr=../peer/ik/build/bin/llama-bench:-rtr 1 -fa 1" \\
      --model /tmp/models/q4_0.gguf --model /tmp/models/q8_0.gguf \\
      -p 512 -n 128 -r 2 -t 2 --rounds 3

A peer is NAME=COMMAND[:EXTRA ARGS]; COMMAND must accept llama-bench's
`-m F -p P -n N -r R -t T -o json` (serval's own `bench model` does, which is
what the smoke mode uses in CI: `--smoke` runs serval against itself on
stories260K with tiny sizes). Peer commits are the caller's to record; `--note`
is printed with the figures.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_peer(text):
    if "=" not in text:
        raise SystemExit(f"compare.py: --peer {text!r}: expected NAME=COMMAND[:EXTRA ARGS]")
    name, rest = text.split("=", 1)
    cmd, _, extra = rest.partition(":")
    if not name or not cmd.strip():
        raise SystemExit(f"compare.py: --peer {text!r}: empty name or command")
    return name, shlex.split(cmd), shlex.split(extra)


class BenchFailed(Exception):
    """A run that gave no figures (a peer may not read a file's tensor types)."""


def run_bench(cmd, model, args, timeout):
    """One llama-bench-style run; returns {test name: t/s} (pp<P>, tg<N>)."""
    full = cmd + ["-m", model, "-p", str(args.p), "-n", str(args.n), "-r", str(args.r), "-t", str(args.t),
                  "-o", "json"]
    try:
        res = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchFailed(f"{' '.join(full)}: no answer within {timeout} s")
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise BenchFailed(f"{' '.join(full)} exited {res.returncode}: {' | '.join(tail)}")
    # llama-bench may print log lines around the JSON array.
    out = res.stdout
    start, end = out.find("["), out.rfind("]")
    if start < 0 or end < start:
        raise BenchFailed(f"{' '.join(full)}: no JSON in its output")
    rows = json.loads(out[start:end + 1])
    figures, size = {}, 0
    for row in rows:
        p, n = int(row.get("n_prompt", 0)), int(row.get("n_gen", 0))
        test = f"pp{p}" if n == 0 else f"tg{n}" if p == 0 else f"pp{p}+tg{n}"
        figures[test] = float(row["avg_ts"])
        size = int(row.get("model_size", size))
    return figures, size


def moe_unread_bytes(serval, model):
    """Bytes of a mixture-of-experts file that one decoded token does not read:
    (1 - expert_used_count / expert_count) of its *_exps tensors, from `serval
    gguf info`. 0 for a dense file, or when the file cannot be read that way."""
    try:
        res = subprocess.run([serval, "gguf", "info", model], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    count = used = None
    exps = 0
    for line in res.stdout.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0].endswith(".expert_count"):
            count = int(f[2])
        elif len(f) >= 3 and f[0].endswith(".expert_used_count"):
            used = int(f[2])
        elif len(f) >= 4 and "_exps." in f[0] and "bytes" in f:
            exps += int(f[f.index("bytes") - 1])
    if not count or not used or used > count:
        return 0
    return exps * (count - used) // count


def roofline(path, threads, mb):
    """Median memory read bandwidth in GB/s from serval_roofline (None if it is absent)."""
    if not path or not os.path.exists(path):
        return None
    cmd = [path, "--threads", str(threads), "--reps", "3"] + (["--mb", str(mb)] if mb else [])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"memory read bandwidth\s+([0-9.]+)\s*/\s*([0-9.]+)\s*GB/s", res.stdout)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serval", default=os.path.join(ROOT, "build", "serval"))
    ap.add_argument("--roofline", default=None, help="serval_roofline (default: beside --serval, bench/)")
    ap.add_argument("--peer", action="append", default=[], help="NAME=COMMAND[:EXTRA ARGS] (repeatable)")
    ap.add_argument("--model", action="append", default=[], help="GGUF file (repeatable)")
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (pp test; 0: none)")
    ap.add_argument("-n", type=int, default=128, help="generated tokens (tg test; 0: none)")
    ap.add_argument("-r", type=int, default=2, help="repetitions inside each run")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    ap.add_argument("--note", default="", help="printed with the figures (peer commits, build flags)")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    ap.add_argument("--smoke", action="store_true", help="CI: serval against itself on stories260K, tiny sizes")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"), help="../shared (for --smoke)")
    args = ap.parse_args()

    mb = 0
    if args.smoke:
        args.model = args.model or [os.path.join(args.shared, "models", "stories260K.gguf")]
        mb = 64
        args.peer = args.peer or [f"self={args.serval} bench model"]
        args.p, args.n, args.r, args.t, args.rounds = 32, 8, 1, 1, 2
    for name, value, lo, hi in (("-p", args.p, 0, 65536), ("-n", args.n, 0, 65536), ("-r", args.r, 1, 100),
                                ("-t", args.t, 1, 1024), ("--rounds", args.rounds, 1, 100)):
        if not lo <= value <= hi:
            raise SystemExit(f"compare.py: {name} {value}: must be in [{lo}, {hi}]")
    if args.p == 0 and args.n == 0:
        raise SystemExit("compare.py: -p and -n are both 0: nothing to measure")
    if not args.model:
        raise SystemExit("compare.py: no --model given")
    if not args.peer:
        raise SystemExit("compare.py: no --peer given (NAME=path/to/llama-bench)")
    for m in args.model:
        if not os.path.isfile(m):
            raise SystemExit(f"compare.py: --model {m}: no such file")
    peers = [parse_peer(p) for p in args.peer]
    names = [n for n, _, _ in peers]
    if len(set(names)) != len(names) or "serval" in names:
        raise SystemExit("compare.py: peer names must be distinct and not 'serval'")
    roof = args.roofline or os.path.join(os.path.dirname(os.path.abspath(args.serval)), "bench", "serval_roofline")

    engines = [("serval", [args.serval, "bench", "model"], [])] + peers
    t_start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    bw_before = roofline(roof, args.t, mb)
    # samples[model][test][engine] = [t/s per round]; sizes[model][engine] = bytes
    samples, sizes = {}, {}
    failed = {}  # (model, peer) -> why; a peer that fails on a file is not run on it again
    for rnd in range(args.rounds):
        for model in args.model:
            for name, cmd, extra in engines:
                if (model, name) in failed:
                    continue
                try:
                    figures, size = run_bench(cmd + extra, model, args, args.timeout)
                except BenchFailed as e:
                    if name == "serval":
                        raise SystemExit(f"compare.py: {e}")
                    failed[(model, name)] = str(e)
                    print(f"round {rnd + 1} {os.path.basename(model)} {name}: failed ({e})", file=sys.stderr, flush=True)
                    continue
                sizes.setdefault(model, {})[name] = size
                for test, ts in figures.items():
                    samples.setdefault(model, {}).setdefault(test, {}).setdefault(name, []).append(ts)
                print(f"round {rnd + 1} {os.path.basename(model)} {name}: " +
                      ", ".join(f"{k} {v:.2f}" for k, v in sorted(figures.items())), file=sys.stderr, flush=True)
    bw_after = roofline(roof, args.t, mb)
    bws = [b for b in (bw_before, bw_after) if b]
    bw = statistics.median(bws) if bws else None

    print(f"# serval vs {', '.join(names)} — {t_start}, {args.rounds} interleaved rounds, -t {args.t}, "
          f"-r {args.r}")
    if args.note:
        print(f"# {args.note}")
    print("# memory read bandwidth (serval_roofline, before / after): " +
          (" / ".join(f"{b:.1f}" for b in bws) + " GB/s" if bws else "not measured"))
    head = ["file", "test", "serval t/s"] + [f"{n} t/s" for n in names] + [f"serval / {n}" for n in names]
    head += ["serval / best peer", "serval % of bound", "best peer % of bound"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    out = []
    unread_of = {}  # model -> MoE expert bytes a token does not read
    for model in args.model:
        for test in sorted(samples.get(model, {})):
            per = samples[model][test]
            med = {e: statistics.median(v) for e, v in per.items()}
            best_peer = max(names, key=lambda n: med.get(n, 0.0))  # a failed peer counts as 0
            row = {"file": model, "test": test, "median_ts": med,
                   "ratio": {n: med["serval"] / med[n] for n in names if med.get(n)},
                   "ratio_best": med["serval"] / med[best_peer] if med.get(best_peer) else None,
                   "samples": per}
            cells = [os.path.basename(model), test, f"{med['serval']:.2f}"]
            cells += [f"{med[n]:.2f}" if n in med else "—" for n in names]
            cells += [f"{row['ratio'][n]:.2f}×" if n in row["ratio"] else "—" for n in names]
            cells.append(f"{row['ratio_best']:.2f}× ({best_peer})" if row["ratio_best"] else "—")
            if test.startswith("tg") and bw:
                unread = unread_of.setdefault(model, moe_unread_bytes(args.serval, model))
                share = {e: (sizes[model][e] - unread) * med[e] / 1e9 / bw for e in med if sizes[model].get(e)}
                row["share_of_bound"] = share
                cells.append(f"{100 * share['serval']:.0f} %" if "serval" in share else "—")
                cells.append(f"{100 * share[best_peer]:.0f} %" if best_peer in share else "—")
            else:
                cells += ["—", "—"]
            print("| " + " | ".join(cells) + " |")
            out.append(row)
    for (model, name), why in failed.items():
        print(f"# {name} gave no figures for {os.path.basename(model)}: {why}")
    if args.smoke:
        # Every test of every file has a positive median for every engine and a ratio.
        want = ({f"pp{args.p}"} if args.p else set()) | ({f"tg{args.n}"} if args.n else set())
        got = {(r["file"], r["test"]) for r in out}
        missing = [(m, t) for m in args.model for t in want if (m, t) not in got]
        bad = [r["test"] for r in out if any(v <= 0 for v in r["median_ts"].values()) or len(r["ratio"]) != len(names)]
        if missing or bad or len(out) != len(args.model) * len(want):
            raise SystemExit(f"compare.py --smoke: missing {missing}, bad rows {bad}, rows {len(out)}")
        print("compare.py --smoke: ok")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"started": t_start, "bandwidth_gb_s": bws, "threads": args.t, "rounds": args.rounds,
                       "note": args.note, "rows": out,
                       "failed": [{"file": m, "peer": n, "why": w} for (m, n), w in failed.items()]}, f, indent=1)


if __name__ == "__main__":
    main()
