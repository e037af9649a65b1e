#!/usr/bin/env python3
"""`serval gateway` in front of real `serval serve` replicas (stories260K), all
real processes on loopback:

- cache-aware routing against round-robin on a multi-turn chat workload: the
  prefix-cache hit rate read from the replicas' own metrics, and TTFT;
- a replica SIGKILLed under 32 concurrent streams: nothing that had not started
  streaming is lost, started streams end with an error event, the breaker
  opens, and closes again when the replica is back;
- the ledger against what the clients were told, across a gateway restart;
- graceful drain on SIGTERM; configuration errors.

The gateway's unit behaviours (fallback chains, RPM/TPM, budgets, key admin,
retries) are tested against stub upstreams in tests/gateway (C++).
"""

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import Config, Gateway, Server, check, eq, get, metric, metrics, post, stream, wait_until  # noqa: E402

suite = harness.Suite("server_gateway")

# Three replicas, each with a KV pool small enough that it holds the
# conversations of one third of the users but not all of them (640 bytes a
# token, f16): the setting where routing decides the hit rate.
REPLICA_ARGS = ("--kv-memory", "1700K", "--max-seqs", "8")
NAME = ("--served-model-name", "stories")


def replicas(n=3, args=REPLICA_ARGS, ports=None):
    return [Server(*(NAME + tuple(args)), name=f"replica{i}", port=(ports[i] if ports else 0)) for i in range(n)]


def gateway_toml(servers, policy="cache_aware", extra=""):
    ups = ", ".join(f'"http://127.0.0.1:{s.port}"' for s in servers)
    return f"""
[routing]
policy = "{policy}"
[health]
interval_s = 0.3
timeout_s = 1
[breaker]
failures = 3
open_s = 1
max_open_s = 2
[retry]
attempts = 3
backoff_ms = 10
{extra}
[[models]]
name = "stories"
upstreams = [{ups}]
"""


def prefix_counters(servers):
    hits = queries = 0.0
    for s in servers:
        m = metrics(s.port)
        hits += m.get("serval_prefix_cache_hits_total", 0)
        queries += m.get("serval_prefix_cache_queries_total", 0)
    return hits, queries


# A multi-turn chat workload: each user's turn resends the whole conversation
# so far (system prompt, earlier turns) plus a new message; turns go round by
# round, users in a shuffled order, a few at a time.
WORDS = ("cat dog bird tree house river sun moon girl boy ball red blue happy sad big small park cake friend "
         "garden flower rain snow walk jump play laugh sing story little mom dad king queen ship sea").split()


def conversation_turns(user, n_turns, rng):
    system = f"You are helper number {user}. " + " ".join(rng.choice(WORDS) for _ in range(30))
    turns = [" ".join(rng.choice(WORDS) for _ in range(45)) for _ in range(n_turns)]
    prompts = []
    history = system
    for t in turns:
        history += "\nUser: " + t + "\nAssistant:"
        prompts.append(history)
        history += " " + " ".join(rng.choice(WORDS) for _ in range(8))
    return prompts


def run_workload(port, n_users=12, n_turns=5, concurrency=3, seed=7):
    rng = random.Random(seed)
    convs = [conversation_turns(u, n_turns, rng) for u in range(n_users)]
    ttfts, errors = [], []
    for t in range(n_turns):
        order = list(range(n_users))
        rng.shuffle(order)
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not order:
                        return
                    u = order.pop()
                t0 = time.monotonic()
                first = []

                def on_event(res, ev):
                    if not first and any(ch.get("text") for ch in ev.get("choices", [])):
                        first.append(time.monotonic() - t0)

                r = stream(port, "/v1/completions", {"model": "stories", "prompt": convs[u][t], "max_tokens": 4,
                                                     "temperature": 0, "stream": True}, on_event=on_event)
                with lock:
                    if r.status != 200 or not r.done or r.error:
                        errors.append((r.status, r.error, r.body[:200]))
                    elif first:
                        ttfts.append(first[0])

        ths = [threading.Thread(target=worker) for _ in range(concurrency)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(120)
    return ttfts, errors


def measure_policy(policy):
    servers = replicas()
    for s in servers:
        s.start()
    try:
        with Gateway(gateway_toml(servers, policy)) as gw:
            h0, q0 = prefix_counters(servers)
            ttfts, errors = run_workload(gw.port)
            h1, q1 = prefix_counters(servers)
            routing = {r: metric(gw.port, "serval_gateway_routing_decisions_total", {"reason": r})
                       for r in ("prefix", "least_loaded", "balance", "round_robin")}
    finally:
        for s in servers:
            s.stop()
            s.cleanup_log()
    check(not errors, f"{policy}: failed requests: {errors[:3]}")
    check(q1 > q0, f"{policy}: the replicas counted no prefix-cache queries")
    return (h1 - h0) / (q1 - q0), statistics.median(ttfts), routing


@suite.test
def cache_aware_routing_doubles_the_prefix_hit_rate_of_round_robin(_):
    # Interleaved, twice each; the hit rates are deterministic enough, TTFT is noisy: medians.
    results = {"round_robin": [], "cache_aware": []}
    for _round in range(2):
        for policy in ("round_robin", "cache_aware"):
            results[policy].append(measure_policy(policy))
    hit = {p: statistics.median(r[0] for r in v) for p, v in results.items()}
    ttft = {p: statistics.median(r[1] for r in v) for p, v in results.items()}
    print(f"  prefix-cache hit rate: cache_aware {hit['cache_aware']:.3f}, round_robin {hit['round_robin']:.3f} "
          f"({hit['cache_aware'] / max(hit['round_robin'], 1e-9):.2f}x); TTFT p50 cache_aware {ttft['cache_aware'] * 1e3:.2f} ms, "
          f"round_robin {ttft['round_robin'] * 1e3:.2f} ms")
    print(f"  routing decisions (cache_aware): {results['cache_aware'][-1][2]}")
    check(hit["cache_aware"] >= 2 * hit["round_robin"],
          f"cache-aware hit rate {hit['cache_aware']:.3f} is not 2x round-robin's {hit['round_robin']:.3f}")
    check(ttft["cache_aware"] < ttft["round_robin"],
          f"cache-aware TTFT p50 {ttft['cache_aware']:.4f} s is not below round-robin's {ttft['round_robin']:.4f} s")


@suite.test
def killed_replica_loses_nothing_unstarted_and_breaker_recovers(_):
    ports = [harness.free_port() for _ in range(3)]
    servers = replicas(args=("--kv-memory", "16M"), ports=ports)
    for s in servers:
        s.start()
    try:
        with Gateway(gateway_toml(servers, "round_robin")) as gw:
            victim = servers[1]
            started = threading.Event()
            n_streaming = [0]
            lock = threading.Lock()

            def client(i):
                seen = [False]

                def on_event(res, ev):
                    if not seen[0] and any(ch.get("text") for ch in ev.get("choices", [])):
                        seen[0] = True
                        with lock:
                            n_streaming[0] += 1
                            if n_streaming[0] >= 16:
                                started.set()

                r = stream(gw.port, "/v1/completions", {"model": "stories", "prompt": f"Once upon a time {i}",
                                                        "max_tokens": 300, "temperature": 0, "stream": True,
                                                        "ignore_eos": True}, timeout=120, on_event=on_event)
                return r, seen[0]

            results = [None] * 32
            threads = []
            for i in range(32):
                th = threading.Thread(target=lambda i=i: results.__setitem__(i, client(i)))
                th.start()
                threads.append(th)
            check(started.wait(60), "16 streams never started")
            victim.kill()  # SIGKILL: its sockets close under the gateway's feet
            # More requests while the gateway is finding out: none may fail.
            late = [post(gw.port, "/v1/completions", {"model": "stories", "prompt": "Hello", "max_tokens": 8})
                    for _ in range(9)]
            for th in threads:
                th.join(120)
            check(all(not th.is_alive() for th in threads), "a stream hung after the replica was killed")
            ok = broken = 0
            for i, (r, seen) in enumerate(results):
                check(r.error is None, f"stream {i}: the connection failed: {r.error!r}")
                eq(r.status, 200, f"stream {i} status (an unstarted request must not be lost)")
                errs = [ev for ev in r.events if "error" in ev]
                if r.done and not errs:
                    ok += 1
                else:
                    check(seen, f"stream {i} failed before it started streaming: {errs}")
                    check(errs and errs[-1]["error"]["code"] == "upstream_stream_broken",
                          f"stream {i} ended without an error event: done={r.done} events={len(r.events)}")
                    broken += 1
            for r in late:
                eq(r.status, 200, f"request after the kill: {r.body[:200]!r}")
            print(f"  32 streams: {ok} completed, {broken} ended with an error event (on the killed replica); "
                  f"9 requests sent after the kill all answered")
            check(broken > 0, "no stream was on the killed replica (round-robin should have put some there)")
            up = f"http://127.0.0.1:{victim.port}"
            label = {"model": "stories", "upstream": up}

            def gauge(name):
                return metric(gw.port, name, label if "opened" not in name else {"upstream": up})

            check(gauge("serval_gateway_breaker_opened_total") >= 1, "the killed replica's breaker never opened")
            check(gauge("serval_gateway_breaker_state") in (1.0, 2.0), "breaker of the killed replica: not open or half-open")
            eq(gauge("serval_gateway_upstream_healthy"), 0.0, "health of the killed replica")
            # Back on the same port: health checks see it, the breaker closes, it gets traffic again.
            servers[1] = Server(*(NAME + ("--kv-memory", "16M")), name="replica1b", port=ports[1])
            servers[1].start()
            check(wait_until(lambda: gauge("serval_gateway_breaker_state") == 0.0 and gauge("serval_gateway_upstream_healthy") == 1.0, 15)[1] is not None,
                  f"the breaker did not close after the replica came back (state {gauge('serval_gateway_breaker_state')})")
            before = metric(gw.port, "serval_gateway_upstream_requests_total", {"upstream": up, "outcome": "200"}) or 0
            for _ in range(6):
                eq(post(gw.port, "/v1/completions", {"model": "stories", "prompt": "Hi", "max_tokens": 2}).status, 200,
                   "request after recovery")
            after = metric(gw.port, "serval_gateway_upstream_requests_total", {"upstream": up, "outcome": "200"}) or 0
            check(after > before, "the recovered replica got no request")
    finally:
        for s in servers:
            s.stop()
            s.cleanup_log()


@suite.test
def ledger_matches_client_usage_across_a_restart(_):
    import tempfile
    admin = "admin-key-for-the-test-0001"
    user = "user-key-for-the-test-00001"
    sha = lambda k: subprocess.run([Config.serval, "gateway", "hash-key", k], capture_output=True, text=True,  # noqa: E731
                                   check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="serval-gw-ledger-") as d, Server(*NAME, name="replica") as srv:
        extra = f"""[auth]
admin_key_sha256 = "{sha(admin)}"
require_key = true
db = "{d}/ledger.db"
[[keys]]
name = "team"
sha256 = "{sha(user)}"
"""
        toml = gateway_toml([srv], extra=extra).replace('name = "stories"', 'name = "stories"\nprice_input_per_mtok = 100\nprice_output_per_mtok = 300')
        auth = {"Authorization": f"Bearer {user}"}
        seen_p = seen_c = 0
        for restart in range(2):
            with Gateway(toml) as gw:
                for i in range(4):
                    body = {"model": "stories", "prompt": f"Once upon a time {i}", "max_tokens": 5 + i}
                    if i % 2:
                        body.update(stream=True, stream_options={"include_usage": True})
                        r = stream(gw.port, "/v1/completions", body, headers=auth)
                        r.check_well_formed("streamed")
                        u = r.usage()
                    else:
                        r = post(gw.port, "/v1/completions", body, headers=auth)
                        eq(r.status, 200, "completion via the gateway")
                        u = r.json()["usage"]
                    seen_p += u["prompt_tokens"]
                    seen_c += u["completion_tokens"]
                r = get(gw.port, "/v1/gateway/usage", headers={"Authorization": f"Bearer {admin}"})
                eq(r.status, 200, "usage route")
                total = r.json()["total"]
                eq((total["requests"], total["prompt_tokens"], total["completion_tokens"]), (4 * (restart + 1), seen_p, seen_c),
                   f"ledger totals after {restart} restarts vs what the clients were told")
                expect = seen_p * 100 / 1e6 + seen_c * 300 / 1e6
                check(abs(total["spend"] - expect) < 1e-9, f"spend {total['spend']} != {expect}")
                eq(get(gw.port, "/v1/gateway/usage").status, 401, "usage without a key")


@suite.test
def drains_on_sigterm_and_refuses_bad_configs(_):
    with Server(*NAME, name="replica") as srv:
        gw = Gateway(gateway_toml([srv]))
        gw.start()
        try:
            out = []
            th = threading.Thread(target=lambda: out.append(stream(gw.port, "/v1/completions", {
                "model": "stories", "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}})))
            th.start()
            wait_until(lambda: (metric(gw.port, "serval_gateway_requests_in_flight") or 0) >= 1, 10)
            gw.signal(signal.SIGTERM)
            th.join(60)
            out[0].check_well_formed("stream in flight during the drain")
            eq(out[0].usage()["completion_tokens"], 400, "tokens of the drained stream")
            eq(out[0].finish_reason(), ["length"], "finish reason of the drained stream")
            eq(gw.wait(30), 0, "gateway exit status after a drain")
        finally:
            gw.stop()
            gw.cleanup_log()

    bad = {
        "[server]\nport = 99999\n": ":2: server.port: expected a number in [0, 65535], got 99999",
        '[[models]]\nname = "a"\nupstreams = ["http://h:1"]\nfallback = ["b"]\n': ":1: models[0].fallback: no model named 'b'",
        '[routing]\npolicy = "random"\n': ':2: routing.policy: expected "cache_aware", "round_robin" or "least_loaded"',
        '[[models]]\nname = "a"\nupstreams = ["http://h:1"]\ntimeout = 3\n': ":4: models[0].timeout: unknown key",
    }
    import tempfile
    for text, want in bad.items():
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(text)
        try:
            p = subprocess.run([Config.serval, "gateway", "--config", f.name, "--check"], capture_output=True, text=True)
            eq(p.returncode, 2, f"exit status for {text!r}")
            check(want in p.stderr and p.stderr.count("\n") == 1, f"error for {text!r}: {p.stderr!r} (want {want!r})")
        finally:
            os.unlink(f.name)
    p = subprocess.run([Config.serval, "gateway", "--config", "/nonexistent.toml"], capture_output=True, text=True)
    eq(p.returncode, 2, "missing config file")
    check("cannot open gateway config '/nonexistent.toml'" in p.stderr, p.stderr)
    # Bad flags of the helpers: one line, status 2.
    for args, want in ((["gateway"], "--config is required"),
                       (["gateway", "bench", "--url", "ftp://x"], "expected a URL http://host:port"),
                       (["gateway", "stub", "--port", "99999"], "not in range"),
                       (["gateway", "hash-key", ""], "the key is empty")):
        p = subprocess.run([Config.serval, *args], capture_output=True, text=True)
        check(p.returncode == 2 and want in p.stderr and p.stderr.count("\n") == 1, f"{args}: {p.returncode} {p.stderr!r}")


if __name__ == "__main__":
    suite.main()
