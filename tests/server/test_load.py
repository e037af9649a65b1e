#!/usr/bin/env python3
"""Load and fault tests of `serval serve` (loopback, bounded in time):
- overload ramp to 3x capacity (--max-queue-requests): at or below capacity
  every request succeeds; beyond it the only refusals are 429/503 with an
  OpenAI error body, accepted requests are correct, and resident memory
  plateaus (the peak at 3x is not above the peak at 2x, plus a margin);
- 200 streaming clients that disconnect mid-stream: every KV block returns to
  the pool (serval_kv_blocks_used == 0) and the server still answers;
- one poisoned request in a full batch (extreme but valid sampling settings,
  odd prompts, a client that vanishes): only it may fail; the greedy requests
  batched with it are byte-identical to their solo output;
- a soak: mixed traffic for SERVAL_SOAK_SECONDS (default 60; the long mode in
  docs/RELIABILITY.md uses 600) with no growth in memory, threads or open
  file descriptors between the first and the last third.
Figures (peak RSS, requests served) are printed for docs/RELIABILITY.md."""

import os
import random
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import (  # noqa: E402
    Config, Response, Server, Suite, check, check_error_body, eq, get, metrics, post, run_threads, short, stream,
    wait_until)

suite = Suite("server_load")
C, H = "/v1/completions", "/v1/chat/completions"
GREEDY = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}


def proc_stats(srv):
    """(RSS in KiB, threads, open fds) of the server process."""
    pid = srv.proc.pid
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads, len(os.listdir(f"/proc/{pid}/fd"))


def wait_kv_idle(port, timeout=15):
    def idle():
        m = metrics(port)
        return m if m.get("serval_kv_blocks_used") == 0 and m.get("serval_requests_running") == 0 \
            and m.get("serval_requests_waiting") == 0 else None
    m, _ = wait_until(idle, timeout=timeout, interval=0.05)
    return m


class Sampler:
    """Samples the server's RSS/threads/fds every `every` seconds in a thread."""

    def __init__(self, srv, every=0.1):
        self.srv, self.every, self.samples = srv, every, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                self.samples.append((time.monotonic(),) + proc_stats(self.srv))
            except OSError:
                pass
            time.sleep(self.every)

    def finish(self):
        self.stop.set()
        self.thread.join(5)
        return self.samples


# ------------------------------------------------------------------ overload

CAPACITY = 8


def hammer(port, n_clients, seconds, solo_text):
    """n_clients loop greedy requests for `seconds`; returns status counts and problems."""
    counts, problems = {}, []
    lock = threading.Lock()
    t_end = time.monotonic() + seconds

    def client(i):
        while time.monotonic() < t_end:
            if i % 2:
                resp = post(port, C, GREEDY, timeout=60)
                text = resp.json()["choices"][0]["text"] if resp.status == 200 else None
            else:
                s = stream(port, C, dict(GREEDY, stream=True), timeout=60)
                resp, text = as_response(s), (s.text() if s.status == 200 else None)
                if s.status == 200 and not s.done:
                    problems.append(f"stream {i} did not finish: {s.error!r}")
            with lock:
                counts[resp.status] = counts.get(resp.status, 0) + 1
            if resp.status == 200:
                if text != solo_text:
                    problems.append(f"client {i}: text {text!r} != solo {solo_text!r}")
            elif resp.status in (429, 503):
                try:
                    check_error_body(resp, resp.status, "refusal under overload")
                except AssertionError as e:
                    problems.append(str(e))
                time.sleep(0.05)
            else:
                problems.append(f"client {i}: status {resp.status} {short(resp.body, 200)}")

    run_threads([lambda i=i: client(i) for i in range(n_clients)], timeout=seconds + 90)
    return counts, problems


def as_response(s):
    """A StreamResult as a Response (for check_error_body on a refused stream)."""
    return Response(s.status, s.headers, s.body)


@suite.test
def overload_ramp_3x(_):
    with Server("--max-queue-requests", str(CAPACITY), "--max-seqs", str(CAPACITY), name="overload") as srv:
        solo = post(srv.port, C, GREEDY).json()["choices"][0]["text"]
        sampler = Sampler(srv)
        peaks = {}
        # 1x, 2x, 3x, then 3x again: the allocator's per-thread arenas fill up
        # with the number of connections served at once, and whether 2x or 3x
        # reaches that plateau is timing (2026-12-07: 46 -> 73 -> 81 MiB in one
        # run, 49 -> 49 -> 77 in the next); a second 3x must not grow past it.
        for step, mult in enumerate((1, 2, 3, 3)):
            t0 = time.monotonic()
            counts, problems = hammer(srv.port, CAPACITY * mult, 6, solo)
            peaks[step] = max(s[1] for s in sampler.samples if s[0] >= t0)
            print(f"  {mult}x capacity ({CAPACITY * mult} clients{', again' if step == 3 else ''}): "
                  f"statuses {dict(sorted(counts.items()))}, peak RSS {peaks[step] / 1024:.1f} MiB")
            check(not problems, f"{mult}x: {len(problems)} problems: " + "; ".join(short(p, 300) for p in problems[:5]))
            check(set(counts) <= {200, 429, 503}, f"{mult}x: unexpected statuses {counts}")
            check(counts.get(200, 0) > 0, f"{mult}x: no request succeeded")
            if mult == 1:
                eq(counts.get(429, 0) + counts.get(503, 0), 0, "refusals at capacity (clients <= --max-queue-requests)")
            else:
                check(counts.get(429, 0) > 0, f"{mult}x: no 429 although clients exceed --max-queue-requests")
        sampler.finish()
        # Under ASan freed memory sits in quarantine (256 MiB), so RSS says nothing
        # there; LeakSanitizer checks the server at exit instead.
        plateau = max(peaks[1], peaks[2])
        check(Config.sanitized or peaks[3] <= plateau * 1.10 + 16 * 1024,
              f"resident memory grows with overload: peak {peaks[1] / 1024:.1f} MiB at 2x, {peaks[2] / 1024:.1f} MiB "
              f"at 3x, {peaks[3] / 1024:.1f} MiB at 3x again")
        check(wait_kv_idle(srv.port) is not None, "KV blocks still in use after the overload")
        eq(post(srv.port, C, GREEDY).json()["choices"][0]["text"], solo, "greedy text after the overload")


# ------------------------------------------------------------------ mass disconnect

@suite.test
def disconnect_200_streams(_):
    with Server("--max-queue-requests", "512", "--max-seqs", "64", name="disconnect-200") as srv:
        n = 200
        body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0.8, "ignore_eos": True,
                "stream": True}

        def client(i):
            # Leave after a few events: some while queued (no event yet is not possible
            # with on_event, so the first event), most mid-generation.
            return stream(srv.port, C, dict(body, seed=i), timeout=120,
                          on_event=lambda res, ev, k=1 + i % 5: len(res.events) < k)

        peak, done = [0], threading.Event()

        def watch():  # the disconnects must have found KV blocks in use to free
            while not done.is_set():
                peak[0] = max(peak[0], metrics(srv.port).get("serval_kv_blocks_used") or 0)
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        results = run_threads([lambda i=i: client(i) for i in range(n)], timeout=180)
        done.set()
        watcher.join(5)
        check(peak[0] > 0, "no KV block was ever in use during the 200 streams")
        errors = [f"client {i}: {r!r}" for i, r in enumerate(results) if isinstance(r, Exception)]
        errors += [f"client {i}: status {r.status}" for i, r in enumerate(results)
                   if not isinstance(r, Exception) and r.status != 200]
        check(not errors, f"{len(errors)} clients failed: {'; '.join(errors[:5])}")
        t0 = time.monotonic()
        m = wait_kv_idle(srv.port, timeout=20)
        last = metrics(srv.port)
        check(m is not None, f"KV not back in the pool 20 s after 200 disconnects: kv_blocks_used "
                             f"{last.get('serval_kv_blocks_used')}, running {last.get('serval_requests_running')}, "
                             f"waiting {last.get('serval_requests_waiting')}")
        print(f"  200 clients left mid-stream (peak {peak[0]} KV blocks in use); pool empty "
              f"{time.monotonic() - t0:.2f} s later")
        eq(post(srv.port, C, GREEDY).status, 200, "a request after the disconnects")


# ------------------------------------------------------------------ poisoned request

POISONS = [
    ("temperature 1e-30", C, {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 1e-30}),
    ("top_p 1e-9 and min_p 1", C, {"prompt": "Once", "max_tokens": 30, "temperature": 1.5, "top_p": 1e-9,
                                   "min_p": 1.0}),
    ("max penalties", C, {"prompt": "the the the the", "max_tokens": 30, "temperature": 1, "presence_penalty": 2,
                          "frequency_penalty": 2, "ignore_eos": True}),
    ("logit_bias bans 300 tokens", C, {"prompt": "Once", "max_tokens": 30, "temperature": 1,
                                       "logit_bias": {str(i): -100 for i in range(300)}}),
    ("logit_bias +100 on EOS", C, {"prompt": "Once", "max_tokens": 30, "logit_bias": {"2": 100}}),
    ("control tokens in the prompt", C, {"prompt": [1, 2, 2, 0, 1, 2], "max_tokens": 30, "temperature": 0.9}),
    ("byte tokens only", C, {"prompt": [1] + list(range(3, 259)), "max_tokens": 30, "logprobs": 20}),
    ("odd stop strings", C, {"prompt": "Once upon a time", "max_tokens": 30, "stop": ["\ufffd", "\u0000", " "]}),
    ("n=8 with top logprobs", H, {"messages": [{"role": "user", "content": "\u0000\ud7ff\u202e"}], "n": 8,
                                  "max_tokens": 30, "logprobs": True, "top_logprobs": 20}),
    ("client vanishes at once", C, {"prompt": "Once", "max_tokens": 200, "stream": True, "ignore_eos": True}),
]


@suite.test
def poisoned_request_in_full_batch(_):
    batch = 8
    with Server("--max-seqs", str(batch), name="poison") as srv:
        canaries = [dict(GREEDY, prompt=p, max_tokens=40, stream=True)
                    for p in ("Once upon a time", "Lily and Ben", "The cat", "One day", "Tom had a ball",
                              "The sun was", "Mom said")]
        solo = []
        for c in canaries:
            s = stream(srv.port, C, c)
            s.check_well_formed("solo canary")
            solo.append(s.text())
        outcomes = []
        for name, path, body in POISONS:
            def poison(name=name, path=path, body=body):
                if name == "client vanishes at once":
                    return stream(srv.port, path, body, on_event=lambda res, ev: False)
                if body.get("stream"):
                    return stream(srv.port, path, body)
                return post(srv.port, path, body, timeout=60)
            results = run_threads([poison] + [lambda c=c: stream(srv.port, C, c) for c in canaries], timeout=120)
            p = results[0]
            check(not isinstance(p, Exception), f"{name}: the poisoned request raised {p!r}")
            check(p.status == 200 or 400 <= p.status < 500, f"{name}: status {p.status} {short(p.body, 300)}")
            if p.status != 200:
                check_error_body(as_response(p) if hasattr(p, "events") else p, p.status, name)
            outcomes.append(f"{name}: {p.status}")
            for i, (r, want) in enumerate(zip(results[1:], solo)):
                check(not isinstance(r, Exception), f"{name}: canary {i} raised {r!r}")
                r.check_well_formed(f"{name}: canary {i}")
                eq(r.text(), want, f"{name}: canary {i} text next to the poisoned request (solo output)")
            check(srv.alive(), f"{name}: the server died")
        print("  " + "; ".join(outcomes))
        check(wait_kv_idle(srv.port) is not None, "KV blocks still in use after the poisoned batches")


# ------------------------------------------------------------------ SIGTERM with a queue

@suite.test
def sigterm_drains_queued_requests(_):
    """More accepted requests than the batch holds: on SIGTERM the waiting ones
    are not dropped either; every accepted request runs to its end."""
    srv = Server("--max-seqs", "2", "--drain-timeout", "120", name="sigterm-queue")
    with srv:
        n, gen = 8, 400  # long enough that all 8 are in flight, 6 queued, even on a loaded CI machine
        body = {"prompt": "Once upon a time", "max_tokens": gen, "temperature": 0, "ignore_eos": True}
        results = [None] * n
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, post(srv.port, C, dict(body, seed=i),
                                                                                   timeout=180)), daemon=True)
                   for i in range(n)]
        for t in threads:
            t.start()
        queued, _ = wait_until(lambda: (metrics(srv.port).get("serval_requests_waiting") or 0) > 0
                               and metrics(srv.port).get("serval_http_requests_in_flight") == n, timeout=30)
        check(queued, "the requests never queued up behind the 2-sequence batch")
        srv.signal(signal.SIGTERM)
        for t in threads:
            t.join(180)
        for i, r in enumerate(results):
            check(r is not None, f"request {i}: no answer")
            eq(r.status, 200, f"request {i} status (accepted before SIGTERM)")
            eq(r.json()["usage"]["completion_tokens"], gen, f"request {i} completion_tokens")
        eq(srv.wait(timeout=60), 0, "exit status after draining")
        print(f"  {n} requests (2 running, the rest queued) all completed after SIGTERM; exit 0")


# ------------------------------------------------------------------ soak

@suite.test
def soak_no_growth(_):
    seconds = float(os.environ.get("SERVAL_SOAK_SECONDS", "60"))
    with Server("--max-queue-requests", "16", "--read-timeout", "2", name="soak") as srv:
        solo = post(srv.port, C, GREEDY).json()["choices"][0]["text"]
        stop = threading.Event()
        served, problems = [0], []
        lock = threading.Lock()

        def client(i):
            rng = random.Random(i)
            while not stop.is_set():
                kind = rng.randrange(6)
                try:
                    if kind == 0:
                        r = post(srv.port, C, GREEDY, timeout=60)
                        ok = r.status in (200, 429) and (r.status != 200 or r.json()["choices"][0]["text"] == solo)
                    elif kind == 1:
                        s = stream(srv.port, C, dict(GREEDY, stream=True), timeout=60)
                        ok = s.status == 429 or (s.done and s.text() == solo)
                    elif kind == 2:
                        s = stream(srv.port, C, dict(GREEDY, stream=True, max_tokens=200, ignore_eos=True),
                                   on_event=lambda res, ev: len(res.events) < 3)
                        ok = s.status in (200, 429)
                    elif kind == 3:
                        r = post(srv.port, H, {"messages": [{"role": "user", "content": f"hi {i}"}],
                                               "max_tokens": 8, "temperature": 0.5, "seed": i}, timeout=60)
                        ok = r.status in (200, 429)
                    elif kind == 4:
                        r = post(srv.port, C, {"prompt": [1, 10 ** 6]}, timeout=60)
                        ok = r.status == 400
                    else:
                        r = get(srv.port, "/metrics", timeout=60)
                        ok = r.status == 200
                    with lock:
                        served[0] += 1
                        if not ok:
                            problems.append(f"client {i} kind {kind}")
                except Exception as e:  # noqa: BLE001
                    with lock:
                        problems.append(f"client {i} kind {kind}: {e!r}")

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(6)]
        sampler = Sampler(srv, every=0.5)
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(60)
        check(wait_kv_idle(srv.port) is not None, "KV blocks still in use after the soak")
        time.sleep(0.5)
        end = proc_stats(srv)
        samples = sampler.finish()
        check(not problems, f"{len(problems)} soak requests failed: {'; '.join(short(p, 200) for p in problems[:5])}")
        third = seconds / 3
        first = [s for s in samples if t0 + 0.2 * seconds <= s[0] < t0 + third + 0.2 * seconds]
        last = [s for s in samples if s[0] >= t0 + seconds - third]
        check(first and last, "too few samples")
        rss1, rss2 = max(s[1] for s in first), max(s[1] for s in last)
        thr1, thr2 = max(s[2] for s in first), max(s[2] for s in last)
        print(f"  {seconds:.0f} s, {served[0]} requests; peak RSS {rss1 / 1024:.1f} MiB (first third) -> "
              f"{rss2 / 1024:.1f} MiB (last third); threads {thr1} -> {thr2}; fds at the start "
              f"{samples[0][3]}, at the end (idle) {end[2]}")
        check(Config.sanitized or rss2 <= rss1 * 1.05 + 4 * 1024, f"RSS grew from {rss1} KiB to {rss2} KiB")
        check(thr2 <= thr1, f"threads grew from {thr1} to {thr2}")
        check(end[1] <= samples[0][2], f"threads at the end {end[1]} > at the start {samples[0][2]}")
        check(end[2] <= samples[0][3] + 1, f"open fds grew from {samples[0][3]} to {end[2]}")


if __name__ == "__main__":
    raise SystemExit(suite.main())
