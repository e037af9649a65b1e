#!/usr/bin/env python3
"""The gateway's own cost: added latency per request and its maximum request
rate, measured against a fast stub upstream (`serval gateway stub`) so that no
model time hides it.

Each round runs `serval gateway bench` (small non-streaming completions, one
keep-alive connection per client thread) straight at the stub and through the
gateway, interleaved (direct, gateway, direct, gateway ...), at concurrency 1
(latency) and at --concurrency (throughput). Figures are medians over rounds;
the added latency of a round is its gateway p50 (p99) minus its direct p50
(p99). Everything shares the machine's cores: the load generator, the gateway
and the stub.

  bench/gateway_bench.py --serval build/serval [--rounds 5] [--requests 20000] [--concurrency 16] [--smoke] [--json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import start_serve  # noqa: E402


def bench(serval, url, n, c, warmup):
    p = subprocess.run([serval, "gateway", "bench", "--url", url, "-n", str(n), "-c", str(c), "--warmup", str(warmup),
                        "--json"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"gateway bench against {url} failed: {p.stderr.strip()}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serval", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--gateway-threads", type=int, default=2, help="[server] threads of the gateway")
    ap.add_argument("--smoke", action="store_true", help="one short round (CI: the script keeps working)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.requests = 1, 400
    procs = []
    try:
        stub, stub_port, _ = start_serve([a.serval, "gateway", "stub", "--port", "0", "--model", "stub"], "serval-stub-")
        procs.append(stub)
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(f"""[server]
threads = {a.gateway_threads}
[health]
interval_s = 1
[[models]]
name = "stub"
upstreams = ["http://127.0.0.1:{stub_port}"]
""")
            cfg = f.name
        gw, gw_port, _ = start_serve([a.serval, "gateway", "--config", cfg, "--port", "0"], "serval-gateway-")
        procs.append(gw)
        direct, via = f"http://127.0.0.1:{stub_port}", f"http://127.0.0.1:{gw_port}"
        warm = min(500, a.requests // 4)
        rows = []
        for r in range(a.rounds):
            d1 = bench(a.serval, direct, a.requests // 4, 1, warm)
            g1 = bench(a.serval, via, a.requests // 4, 1, warm)
            dn = bench(a.serval, direct, a.requests, a.concurrency, warm)
            gn = bench(a.serval, via, a.requests, a.concurrency, warm)
            rows.append({
                "added_p50_ms": g1["latency_ms"]["p50"] - d1["latency_ms"]["p50"],
                "added_p99_ms": g1["latency_ms"]["p99"] - d1["latency_ms"]["p99"],
                "direct_p50_ms": d1["latency_ms"]["p50"], "gateway_p50_ms": g1["latency_ms"]["p50"],
                "direct_rps": dn["requests_per_s"], "gateway_rps": gn["requests_per_s"],
                "gateway_c_p50_ms": gn["latency_ms"]["p50"], "gateway_c_p99_ms": gn["latency_ms"]["p99"],
            })
            if not a.json:
                x = rows[-1]
                print(f"round {r + 1}: added p50 {x['added_p50_ms']:.3f} ms, p99 {x['added_p99_ms']:.3f} ms; "
                      f"c={a.concurrency}: gateway {x['gateway_rps']:.0f} req/s, direct {x['direct_rps']:.0f} req/s", flush=True)
        med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
        os.unlink(cfg)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    if a.json:
        print(json.dumps({"rounds": a.rounds, "requests": a.requests, "concurrency": a.concurrency, "median": med, "runs": rows}))
        return 0
    print(f"\nmedians of {a.rounds} rounds ({a.requests} requests at concurrency {a.concurrency}, "
          f"{a.requests // 4} at concurrency 1):")
    print(f"  added latency per request:  p50 {med['added_p50_ms']:.3f} ms   p99 {med['added_p99_ms']:.3f} ms "
          f"(direct p50 {med['direct_p50_ms']:.3f} ms, through the gateway {med['gateway_p50_ms']:.3f} ms)")
    print(f"  requests/s at c={a.concurrency}:     gateway {med['gateway_rps']:.0f}   direct to the stub {med['direct_rps']:.0f} "
          f"(gateway p50 {med['gateway_c_p50_ms']:.3f} ms, p99 {med['gateway_c_p99_ms']:.3f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
