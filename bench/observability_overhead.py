#!/usr/bin/env python3
"""Overhead of serval's metrics and tracing on `serval bench http` throughput.

Starts one `serval serve` per configuration on loopback and runs
`serval bench http` against each in turn, round-robin (so drift on a noisy
machine hits every configuration alike), then prints the median and every run
of requests/s and generated tokens/s, each configuration's ratio of medians to
the first, and the median of its per-round ratios (runs of one round are back
to back, so the paired ratio cancels most of the machine's drift). It also
prints the server's CPU time (user + system, from /proc) per request, which
other load on the machine disturbs less than throughput.

Configurations:
  base     --base-serval BINARY (a build without the observability code), if given
  metrics  this build as is (Prometheus instruments always on)
  full     + --otlp-endpoint (a local OTLP/HTTP receiver, every request traced:
           7+ spans each), --log-format json (to /dev/null), SLOs, a price
           table and the energy model

Usage:
  python3 bench/observability_overhead.py --serval build/serval [--base-serval OLD] \
      [--model ../shared/models/stories260K.gguf] [--runs 5] [-- extra bench http flags]
"""

import argparse
import http.server
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Collector:
    def __init__(self):
        self.spans = 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                # Counts span ids without parsing: the receiver shares the CPUs with the server.
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.spans += body.count(b'"spanId"')
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def cpu_seconds(pid):
    """user + system CPU time of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(binary, model, args, threads, log):
    port = free_port()
    cmd = [binary, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "--kv-memory", "256M", "--max-queue-requests", "4096"] + args
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return p, port
        except Exception:  # noqa: BLE001
            time.sleep(0.05)
    p.kill()
    raise SystemExit(f"server did not start: {cmd}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serval", default="build/serval")
    ap.add_argument("--base-serval")
    ap.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models",
                                                    "stories260K.gguf"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("bench_args", nargs="*", default=["-c", "16", "-n", "256", "--prompt-len", "32", "--gen-len", "32"])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="serval-obs-bench-")
    prices = os.path.join(tmp, "prices.json")
    with open(prices, "w") as f:
        json.dump({"*": {"input_per_million": 0.1, "output_per_million": 0.4}}, f)
    col = Collector()
    configs = []
    if a.base_serval:
        configs.append(("base", a.base_serval, []))
    configs.append(("metrics", a.serval, []))
    configs.append(("full", a.serval, ["--otlp-endpoint", f"http://127.0.0.1:{col.port}/v1/traces", "--log-format",
                                      "json", "--slo-ttft-p99-ms", "500", "--slo-itl-p99-ms", "50",
                                      "--slo-availability", "99.9", "--price-table", prices, "--watts-per-core", "10",
                                      "--grid-intensity", "400"]))
    devnull = open(os.devnull, "wb")
    servers = {}
    try:
        for name, binary, args in configs:
            servers[name] = start(binary, a.model, args, a.threads, devnull)
        results = {name: [] for name, _, _ in configs}
        for i in range(a.runs):
            for name, _, _ in configs:
                proc, port = servers[name]
                cpu0 = cpu_seconds(proc.pid)
                out = subprocess.run([a.serval, "bench", "http", "--url", f"http://127.0.0.1:{port}", "-o", "json",
                                      "--warmup", "4"] + a.bench_args, capture_output=True, timeout=600)
                if out.returncode != 0:
                    raise SystemExit(f"bench http failed on {name}: {out.stderr.decode()}")
                cpu = cpu_seconds(proc.pid) - cpu0  # includes the 4 warm-up requests
                j = json.loads(out.stdout)
                cpu_ms = 1e3 * cpu / (j["completed"] + 4)
                results[name].append((j["requests_per_s"], j["gen_tok_s"], j["failed"], cpu_ms))
                print(f"run {i + 1} {name:8s} {j['requests_per_s']:8.1f} req/s {j['gen_tok_s']:9.1f} gen tok/s"
                      f"  server CPU {cpu_ms:.3f} ms/request  failed {j['failed']}", flush=True)
        print(f"\nserval bench http {' '.join(a.bench_args)} (server -t {a.threads}), {a.runs} runs each, "
              f"medians; spans received by the collector: {col.spans}")
        first = None
        for name, _, _ in configs:
            rps = statistics.median(r[0] for r in results[name])
            tps = statistics.median(r[1] for r in results[name])
            first = first or tps
            runs = ", ".join(f"{r[1]:.0f}" for r in results[name])
            # Paired: each round's runs are back to back, so their ratio cancels most of the machine's drift.
            ref = results[configs[0][0]]
            paired = statistics.median(r[1] / q[1] for r, q in zip(results[name], ref))
            cpu = statistics.median(r[3] for r in results[name])
            cpu_paired = statistics.median(r[3] / q[3] for r, q in zip(results[name], ref))
            print(f"  {name:8s} {rps:8.1f} req/s {tps:9.1f} gen tok/s  ratio of medians {tps / first:.3f}  "
                  f"median paired ratio {paired:.3f} | server CPU {cpu:.3f} ms/request, paired ratio "
                  f"{cpu_paired:.3f}  (tok/s runs: {runs})")
    finally:
        for p, _ in servers.values():
            p.terminate()
            p.wait(10)
        col.httpd.shutdown()


if __name__ == "__main__":
    main()
