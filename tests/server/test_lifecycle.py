#!/usr/bin/env python3
"""Request life cycle of `serval serve` under load:
- a client that disconnects mid-request gets its KV blocks freed at once;
- admission control: past --max-queue-requests / --max-queue-tokens, 429 with
  Retry-After and an OpenAI-style error, while the accepted requests complete;
- SIGTERM under load: /ready turns 503, new requests get 503, every accepted
  request completes, then the process exits 0."""

import http.client
import json
import signal
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import (  # noqa: E402
    Config, Response, Server, Suite, abort, check, check_error_body, eq, get, metric, metrics, post, run_threads, short,
    stream, wait_in_engine, wait_until)

suite = Suite("server_lifecycle")
FREE_WITHIN_S = 1.5 * Config.time_scale  # KV blocks must be back this soon after a client goes away
LONG = {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "ignore_eos": True}


def idle(port):
    m = metrics(port)
    ok = (m.get("serval_kv_blocks_used") == 0 and m.get("serval_requests_running") == 0
          and m.get("serval_requests_waiting") == 0 and m.get("serval_http_requests_in_flight", 0) == 0)
    return m if ok else None


def wait_idle(port, what, t_disconnect):
    m, waited = wait_until(lambda: idle(port), timeout=10, interval=0.01)
    since = time.monotonic() - t_disconnect
    last = metrics(port)
    check(waited is not None,
          f"{what}: not idle 10 s after the client went away: kv_blocks_used {last.get('serval_kv_blocks_used')}, "
          f"requests_running {last.get('serval_requests_running')}, waiting {last.get('serval_requests_waiting')}, "
          f"http in flight {last.get('serval_http_requests_in_flight')}")
    check(since <= FREE_WITHIN_S + 0.5,
          f"{what}: KV blocks freed only {since:.2f} s after the client went away (want <= {FREE_WITHIN_S} s)")
    return since


def server_still_serves(port):
    r = post(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0})
    eq(r.status, 200, "a normal request after the test")
    eq(r.json()["choices"][0]["text"], ", there was a little girl named Lily", "greedy text after the test")


# ------------------------------------------------------------------ disconnect

@suite.test
def disconnect_mid_stream_frees_kv(_):
    with Server(name="disconnect") as srv:
        gen_before = metrics(srv.port).get("serval_generation_tokens_total", 0)
        seen = {}

        def on_event(res, ev):
            if len(res.events) == 5:
                m = metrics(srv.port)
                seen["kv"] = m.get("serval_kv_blocks_used")
                seen["running"] = m.get("serval_requests_running")
                seen["t"] = time.monotonic()
                return False  # drop the connection
            return True

        s = stream(srv.port, "/v1/completions", dict(LONG, stream=True, n=2), on_event=on_event)
        check("t" in seen, f"the stream ended before 5 events (done={s.done}, {len(s.events)} events, error {s.error})")
        check(seen["kv"] and seen["kv"] > 0, f"serval_kv_blocks_used while streaming = {seen['kv']}, want > 0")
        check(seen["running"] and seen["running"] >= 1, f"serval_requests_running while streaming = {seen['running']}")
        took = wait_idle(srv.port, "streaming client disconnect", seen["t"])
        gen = metrics(srv.port).get("serval_generation_tokens_total", 0) - gen_before
        print(f"  freed {took * 1000:.0f} ms after the disconnect; {gen:.0f} of 4000 tokens generated")
        check(gen < 4000, f"all {gen:.0f} tokens were generated: the request was not cancelled")
        server_still_serves(srv.port)


@suite.test
def disconnect_non_streaming_frees_kv(_):
    with Server(name="disconnect-ns") as srv:
        gen_before = metrics(srv.port).get("serval_generation_tokens_total", 0)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=0.3)
        conn.request("POST", "/v1/completions", body=json.dumps(dict(LONG, n=4)),
                     headers={"Content-Type": "application/json"})
        busy, _ = wait_until(lambda: (metrics(srv.port).get("serval_kv_blocks_used") or 0) > 0, timeout=5)
        check(busy, "the request never held KV blocks")
        t = time.monotonic()
        abort(conn)
        took = wait_idle(srv.port, "non-streaming client disconnect", t)
        gen = metrics(srv.port).get("serval_generation_tokens_total", 0) - gen_before
        print(f"  freed {took * 1000:.0f} ms after the disconnect; {gen:.0f} of 8000 tokens generated")
        check(gen < 8000, f"all {gen:.0f} tokens were generated: the request was not cancelled")
        server_still_serves(srv.port)


@suite.test
def disconnect_many_streams(_):
    with Server(name="disconnect-many") as srv:
        t_last = {"t": 0.0}
        lock = threading.Lock()

        def client(i):
            def on_event(res, ev):
                if len(res.events) >= 3 + i:
                    with lock:
                        t_last["t"] = max(t_last["t"], time.monotonic())
                    return False
                return True
            if i % 2:
                body = {"messages": [{"role": "user", "content": f"Story {i}"}], "max_tokens": 1500,
                        "temperature": 0.7, "seed": i, "ignore_eos": True, "stream": True}
                return stream(srv.port, "/v1/chat/completions", body, on_event=on_event)
            return stream(srv.port, "/v1/completions", dict(LONG, stream=True, n=2, prompt=f"Tom {i}"),
                          on_event=on_event)

        results = run_threads([lambda i=i: client(i) for i in range(8)], timeout=60)
        for i, r in enumerate(results):
            check(not isinstance(r, Exception), f"client {i}: {r!r}")
            check(not r.done, f"client {i}: the stream finished before the client left")
        took = wait_idle(srv.port, "8 streaming clients disconnecting", t_last["t"])
        print(f"  all freed {took * 1000:.0f} ms after the last disconnect")
        server_still_serves(srv.port)


@suite.test
def request_timeout_frees_kv(_):
    with Server("--request-timeout", "0.4", name="deadline") as srv:
        t0 = time.monotonic()
        r = post(srv.port, "/v1/completions", dict(LONG, n=4), timeout=30)
        took = time.monotonic() - t0
        e = check_error_body(r, (408, 504), "request past --request-timeout")
        check(took < 3 * Config.time_scale, f"the deadline answer took {took:.1f} s (deadline 0.4 s)")
        s = stream(srv.port, "/v1/completions", dict(LONG, n=2, stream=True), timeout=30)
        eq(s.status, 200, "streaming status")
        check(s.done, "a stream past its deadline still ends with [DONE]")
        errs = [ev for ev in s.events if "error" in ev]
        eq(len(errs), 1, f"one error event in a stream past its deadline ({len(s.events)} events)")
        eq(errs[0]["error"].get("code"), e["code"], "the stream's error code = the non-streamed one")
        took = wait_idle(srv.port, "deadline", time.monotonic())
        server_still_serves(srv.port)


# ------------------------------------------------------------------ 429

def check_429(r, what):
    e = check_error_body(r, 429, what)
    ra = r.header("retry-after")
    check(ra.isdigit() and int(ra) >= 1, f"{what}: Retry-After should be a positive integer of seconds, got '{ra}'")
    return e


@suite.test
def queue_requests_limit_429(_):
    with Server("--max-queue-requests", "2", name="queue-requests") as srv:
        def client(i):
            body = dict(LONG, max_tokens=1500, prompt=f"Lily {i}", stream=True,
                        stream_options={"include_usage": True})
            return stream(srv.port, "/v1/completions", body)

        results = run_threads([lambda i=i: client(i) for i in range(8)], timeout=90)
        ok, rejected = [], []
        for i, r in enumerate(results):
            check(not isinstance(r, Exception), f"client {i}: {r!r}")
            (ok if r.status == 200 else rejected).append(r)
        print(f"  {len(ok)} accepted, {len(rejected)} rejected")
        check(len(ok) >= 2, f"only {len(ok)} of 8 accepted with --max-queue-requests 2")
        check(rejected, "no request got 429 with 8 concurrent long requests and --max-queue-requests 2")
        for r in rejected:
            check_429(Response(r.status, r.headers, r.body), "rejected request")
        for r in ok:
            r.check_well_formed("accepted request")
            eq(r.finish_reason(), ["length"], "accepted request finish_reason")
            eq(r.usage()["completion_tokens"], 1500, "accepted request completion_tokens")
        # Capacity is released: a request now gets through, chat and non-streaming too.
        _, waited = wait_until(lambda: metrics(srv.port).get("serval_http_requests_in_flight") == 0, timeout=5)
        check(waited is not None, "serval_http_requests_in_flight did not return to 0")
        r = post(srv.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        eq(r.status, 200, "a request after the others finished")
        eq(metric(srv.port, "serval_http_responses_total", {"code": "429"}), len(rejected),
           'serval_http_responses_total{code="429"}')


@suite.test
def sequential_client_never_429(_):
    # One request at a time never exceeds --max-queue-requests 1: the slot must
    # be free again by the time the client has read the whole response.
    with Server("--max-queue-requests", "1", name="sequential") as srv:
        codes = {}
        first_bad = None
        for i in range(400):
            if i % 2:
                r = post(srv.port, "/v1/completions", {"prompt": "Tom", "max_tokens": 2})
                status, body = r.status, r.body
            else:
                s = stream(srv.port, "/v1/completions", {"prompt": "Tom", "max_tokens": 2, "stream": True})
                status, body = s.status, s.body
                if status == 200 and not s.done:
                    status = "no [DONE]"
            codes[status] = codes.get(status, 0) + 1
            if status != 200 and first_bad is None:
                first_bad = f"request {i} ({'non-' if i % 2 else ''}streaming): {status} {short(body, 300)}"
        check(codes.get(200) == 400, f"400 sequential requests with --max-queue-requests 1 got {codes}; first: {first_bad}")


@suite.test
def queue_tokens_limit_429(_):
    with Server("--max-queue-tokens", "3000", name="queue-tokens") as srv:
        started = threading.Event()
        first = {}

        def first_client():
            first["r"] = stream(srv.port, "/v1/completions", dict(LONG, stream=True),  # 5 + 2000 tokens
                                on_event=lambda res, ev: started.set())

        th = threading.Thread(target=first_client, daemon=True)
        th.start()
        check(started.wait(30), "the first request never started streaming")
        # 2005 in flight; 5 + 1500 more would pass 3000.
        r = post(srv.port, "/v1/completions", dict(LONG, max_tokens=1500))
        check_429(r, "request past --max-queue-tokens")
        r2 = post(srv.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 1500})
        check_429(r2, "chat request past --max-queue-tokens")
        # 5 + 900 more fits.
        r3 = post(srv.port, "/v1/completions", dict(LONG, max_tokens=900))
        eq(r3.status, 200, f"a request within --max-queue-tokens ({short(r3.body, 200)})")
        eq(r3.json()["usage"]["completion_tokens"], 900, "its completion_tokens")
        th.join(60)
        first["r"].check_well_formed("first request")
        eq(first["r"].finish_reason(), ["length"], "first request finish_reason")
        check(first["r"].text(), "first request text")


# ------------------------------------------------------------------ SIGTERM

@suite.test
def sigterm_under_load_drains(_):
    srv = Server("--drain-timeout", "60", name="sigterm")
    with srv:
        n = 6
        started = [threading.Event() for _ in range(n)]
        results = [None] * n

        def client(i):
            if i % 3 == 2:
                body = {"messages": [{"role": "user", "content": f"Story {i}"}], "max_tokens": 1200,
                        "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
                path = "/v1/chat/completions"
            else:
                body = dict(LONG, max_tokens=1200, prompt=f"Ben and {i}", stream=True,
                            stream_options={"include_usage": True})
                path = "/v1/completions"
            results[i] = stream(srv.port, path, body, on_event=lambda res, ev: started[i].set())

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for i, e in enumerate(started):
            check(e.wait(30), f"stream {i} never started")
        srv.signal(signal.SIGTERM)
        t_sig = time.monotonic()
        ready, waited = wait_until(lambda: get(srv.port, "/ready").status == 503, timeout=2 * Config.time_scale,
                                   interval=0.005)
        check(ready, "/ready did not turn 503 within 2 s of SIGTERM")
        r = get(srv.port, "/ready")
        check_error_body(r, 503, "/ready while draining")
        r = post(srv.port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})
        check_error_body(r, 503, "new completion while draining")
        r = post(srv.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        check_error_body(r, 503, "new chat completion while draining")
        r = get(srv.port, "/health")
        eq(r.status, 200, "/health (liveness) while draining")
        still_running = sum(1 for x in results if x is None)
        check(still_running > 0, "every stream had finished before the 503 checks: the load was too short to test")
        for t in threads:
            t.join(60)
        for i, res in enumerate(results):
            check(res is not None, f"stream {i} did not finish within 60 s")
            res.check_well_formed(f"stream {i} after SIGTERM")
            eq(res.finish_reason(), ["length"], f"stream {i} finish_reason")
            eq(res.usage()["completion_tokens"], 1200, f"stream {i} completion_tokens (ran to the end)")
        try:
            code = srv.wait(timeout=30)
        except Exception:  # noqa: BLE001
            raise AssertionError("the server did not exit within 30 s of finishing its requests after SIGTERM")
        print(f"  {still_running} streams in flight at the 503 checks; exited {code} "
              f"{time.monotonic() - t_sig:.2f} s after SIGTERM")
        eq(code, 0, f"exit status after SIGTERM (log: {short(srv.log()[-500:])})")


@suite.test
def sigterm_idle_exits_zero(_):
    srv = Server(name="sigterm-idle")
    with srv:
        post(srv.port, "/v1/completions", {"prompt": "Tom", "max_tokens": 3})
        t = time.monotonic()
        srv.signal(signal.SIGTERM)
        code = srv.wait(timeout=20)
        eq(code, 0, "exit status after SIGTERM when idle")
        took = time.monotonic() - t
        check(took < 5 * Config.time_scale, f"an idle server took {took:.1f} s to exit on SIGTERM")
        try:
            socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()
            raise AssertionError("the port still accepts connections after exit")
        except ConnectionRefusedError:
            pass


@suite.test
def second_sigterm_stops_at_once(_):
    """A request that cannot finish (the engine is held paused) keeps the drain
    waiting; a second SIGTERM stops at once: exit status 1 naming the unfinished
    request, no crash, the client's connection closed."""
    srv = Server("--engine-control", "--drain-timeout", "60", name="sigterm-twice")
    with srv:
        eq(post(srv.port, "/v1/engine/pause", {}).status, 200, "pause")
        out = []

        def client():
            try:
                out.append(post(srv.port, "/v1/completions", LONG, timeout=60).status)
            except OSError as e:  # the server went away mid-request: what a client sees
                out.append(type(e).__name__)
        t = threading.Thread(target=client)
        t.start()
        check(wait_in_engine(srv.port, 1), "the request is in the engine")
        srv.signal(signal.SIGTERM)
        time.sleep(0.5)
        check(srv.alive(), "the first SIGTERM drains: the server waits for the paused request")
        t_second = time.monotonic()
        srv.signal(signal.SIGTERM)
        code = srv.wait(timeout=20)
        took = time.monotonic() - t_second
        eq(code, 1, f"exit status after the second SIGTERM (log: {short(srv.log()[-500:])})")
        check("stopped with 1 requests unfinished" in srv.log(), f"the last line names the unfinished request: {short(srv.log()[-300:])}")
        check(took < 5 * Config.time_scale, f"the second SIGTERM took {took:.1f} s to stop the server")
        t.join(30)
        check(not t.is_alive() and out and out[0] != 200, f"the client's request ended without a 200: {out}")


if __name__ == "__main__":
    raise SystemExit(suite.main())
