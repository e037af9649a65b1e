#!/usr/bin/env python3
"""Observability of `serval serve`:
- /metrics after traffic passes `promtool check metrics`; histogram counts and
  sums match the requests sent; SLO good/total counters and the sliding-window
  gauges move as scripted traffic dictates; per-tenant token, cost, energy and
  carbon counters equal what the responses' `usage` report;
- a real Prometheus server scrapes serval and answers a PromQL query over the
  TTFT histogram;
- a test OTLP/HTTP receiver gets the spans of a request, with the propagated
  W3C trace id and correct parent/child links; an absent collector costs
  dropped spans, never failed requests;
- `--log-format json` access logs carry the request and trace ids;
- GET /v1/engine/state (API key protected), read while the engine is held
  between steps (POST /v1/engine/pause / step / resume, --engine-control);
- the example alerting rules pass `promtool check rules` and `promtool test rules`."""

import http.server
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import (  # noqa: E402
    REPO, Config, Server, Suite, check, check_error_body, eq, free_port, get, parse_metrics, post, short, stream,
    wait_in_engine, wait_until)

suite = Suite("server_observability")
PROMPT = "Once upon a time"
KEYS = ["sk-alpha", "sk-beta"]
PRICES = {"*": {"input_per_million": 1500.0, "output_per_million": 6000.0}}
RULES = os.path.join(REPO, "deploy", "prometheus", "serval-rules.yml")
RULES_TEST = os.path.join(REPO, "deploy", "prometheus", "serval-rules.test.yml")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


def auth(i=0):
    return {"Authorization": f"Bearer {KEYS[i]}"}


def promtool():
    p = shutil.which("promtool")
    check(p is not None, "promtool not found (Debian package 'prometheus'; scripts/install-deps.sh installs it)")
    return p


def scrape(port):
    r = get(port, "/metrics", headers=auth())
    eq(r.status, 200, "GET /metrics")
    return r.body.decode()


def samples(port):
    """{(name, frozenset(labels without model)): value}"""
    s, _, _ = parse_metrics(scrape(port))
    out = {}
    for name, vals in s.items():
        for lbl, v in vals:
            out[(name, frozenset((k, x) for k, x in lbl.items() if k != "model"))] = v
    return out


def val(m, name, **labels):
    return m.get((name, frozenset(labels.items())), 0.0)


def delta(before, after, name, **labels):
    return val(after, name, **labels) - val(before, name, **labels)


def complete(port, key=0, max_tokens=4, prompt=PROMPT, headers=None, **extra):
    h = dict(auth(key))
    h.update(headers or {})
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    body.update(extra)
    r = post(port, "/v1/completions", body, headers=h)
    eq(r.status, 200, f"completion: {short(r.body)}")
    return r


# ------------------------------------------------------------------ fixture

class Ctx:
    pass


@suite.setup
def fixture():
    import contextlib

    @contextlib.contextmanager
    def cm():
        ctx = Ctx()
        ctx.tmp = tempfile.mkdtemp(prefix="serval-obs-")
        prices = os.path.join(ctx.tmp, "prices.json")
        with open(prices, "w") as f:
            json.dump(PRICES, f)
        # TTFT objective loose (every request is good), ITL objective
        # impossible (1 microsecond: every gap is bad): both counters move in
        # a known way.
        args = ["--api-key", KEYS[0], "--api-key", KEYS[1], "--slo-ttft-p99-ms", "60000", "--slo-itl-p99-ms", "0.001",
                "--slo-availability", "99.9", "--price-table", prices, "--watts-per-core", "12.5",
                "--grid-intensity", "400", "--log-format", "json", "--engine-control"]
        with Server(*args, name="obs") as srv:
            ctx.srv = srv
            ctx.port = srv.port
            yield ctx
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    return cm()


# ------------------------------------------------------------------ /metrics

@suite.test
def promtool_check_metrics_after_traffic(ctx):
    complete(ctx.port)
    res = stream(ctx.port, "/v1/chat/completions",
                 {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True},
                 headers=auth(1))
    res.check_well_formed("chat stream")
    r = post(ctx.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": -1}, headers=auth())
    eq(r.status, 400, "bad max_tokens")
    text = scrape(ctx.port)
    p = subprocess.run([promtool(), "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    out = (p.stdout + p.stderr).decode()
    eq(p.returncode, 0, f"promtool check metrics exit status (output: {short(out)})")
    check(not out.strip(), f"promtool check metrics reported problems: {short(out)}")
    _, _, types = parse_metrics(text)
    for name in ("serval_time_to_first_token_seconds", "serval_inter_token_latency_seconds",
                 "serval_request_duration_seconds", "serval_request_queue_seconds", "serval_request_prefill_seconds",
                 "serval_request_decode_seconds", "serval_request_prompt_tokens", "serval_request_generation_tokens"):
        eq(types.get(name), "histogram", f"# TYPE of {name}")
    for name in ("serval_preemptions_total", "serval_prefix_cache_queries_total", "serval_prefix_cache_hits_total",
                 "serval_spec_decode_drafts_total", "serval_spec_decode_accepted_tokens_total",
                 "serval_http_responses_total", "serval_request_finished_total", "serval_tenant_cost_usd_total"):
        eq(types.get(name), "counter", f"# TYPE of {name}")
    for name in ("serval_requests_running", "serval_requests_waiting", "serval_kv_blocks_used",
                 "serval_kv_blocks_capacity", "serval_kv_usage_ratio"):
        eq(types.get(name), "gauge", f"# TYPE of {name}")
    check('model="' in text, "samples carry a model label")


@suite.test
def histogram_counts_match_requests(ctx):
    n, k = 5, 6
    before = samples(ctx.port)
    usages = [complete(ctx.port, max_tokens=k).json()["usage"] for _ in range(n)]
    after = samples(ctx.port)
    # One TTFT, end-to-end, queue, prefill and decode observation per request;
    # k - 1 inter-token gaps per request.
    for name in ("serval_time_to_first_token_seconds", "serval_request_duration_seconds",
                 "serval_request_queue_seconds", "serval_request_prefill_seconds", "serval_request_decode_seconds",
                 "serval_request_prompt_tokens", "serval_request_generation_tokens"):
        eq(delta(before, after, name + "_count"), n, f"{name}_count increase after {n} requests")
        eq(delta(before, after, name + "_bucket", le="+Inf"), n, f"{name}_bucket{{le=+Inf}} increase")
    eq(delta(before, after, "serval_inter_token_latency_seconds_count"), n * (k - 1), "inter-token latency count")
    eq(delta(before, after, "serval_request_generation_tokens_sum"), n * k, "generation tokens histogram sum")
    eq(delta(before, after, "serval_request_prompt_tokens_sum"), sum(u["prompt_tokens"] for u in usages),
       "prompt tokens histogram sum")
    eq(delta(before, after, "serval_request_finished_total", finish_reason="length"), n, "finished (length)")
    # The n completions and the first scrape (counted once it is sent).
    eq(delta(before, after, "serval_http_responses_total", code="200"), n + 1, "HTTP 200 responses")
    # Buckets are cumulative and end with the count.
    s, _, _ = parse_metrics(scrape(ctx.port))
    bk = [(float(lbl["le"]), v) for lbl, v in s["serval_time_to_first_token_seconds_bucket"]]
    check(all(a[1] <= b[1] for a, b in zip(bk, bk[1:])), f"TTFT buckets not cumulative: {bk}")
    # A TTFT is at most its request's end-to-end latency.
    check(val(after, "serval_time_to_first_token_seconds_sum") <= val(after, "serval_request_duration_seconds_sum"),
          "sum of TTFTs exceeds the sum of end-to-end latencies")


@suite.test
def slo_counters_follow_traffic(ctx):
    before = samples(ctx.port)
    n, k = 3, 4
    for _ in range(n):
        complete(ctx.port, max_tokens=k)
    r = post(ctx.port, "/v1/completions", {"prompt": PROMPT, "temperature": -3}, headers=auth())
    eq(r.status, 400, "bad temperature")
    after = samples(ctx.port)
    d = lambda name, slo: delta(before, after, name, slo=slo)  # noqa: E731
    eq(d("serval_slo_events_total", "ttft"), n, "TTFT SLO events")
    eq(d("serval_slo_good_events_total", "ttft"), n, "TTFT SLO good events (60 s bound)")
    eq(d("serval_slo_events_total", "itl"), n * (k - 1), "ITL SLO events")
    eq(d("serval_slo_good_events_total", "itl"), 0, "ITL SLO good events (1 us bound)")
    # A 400 is the client's fault: still available.
    eq(d("serval_slo_events_total", "availability"), n + 1, "availability SLO events")
    eq(d("serval_slo_good_events_total", "availability"), n + 1, "availability SLO good events")
    eq(val(after, "serval_slo_objective_ratio", slo="availability"), 0.999, "availability objective")
    eq(val(after, "serval_slo_threshold_seconds", slo="itl"), 1e-6, "ITL threshold")
    # In-process windows: every ITL event so far was bad, every TTFT good.
    eq(val(after, "serval_slo_attainment_ratio", slo="itl", window="5m"), 0.0, "ITL attainment over 5m")
    check(abs(val(after, "serval_slo_error_budget_burn_rate", slo="itl", window="1h") - 100.0) < 1e-6,
          f"ITL burn rate over 1h: expected 100 (all bad, 1% budget), got "
          f"{val(after, 'serval_slo_error_budget_burn_rate', slo='itl', window='1h')}")
    eq(val(after, "serval_slo_attainment_ratio", slo="ttft", window="6h"), 1.0, "TTFT attainment over 6h")
    eq(val(after, "serval_slo_error_budget_burn_rate", slo="ttft", window="5m"), 0.0, "TTFT burn rate over 5m")


@suite.test
def tenant_cost_and_energy(ctx):
    before = samples(ctx.port)
    u0 = [complete(ctx.port, key=0, max_tokens=m).json()["usage"] for m in (3, 7)]
    u1 = [complete(ctx.port, key=1, max_tokens=5, prompt="The dog").json()["usage"]]
    res = stream(ctx.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "stream": True,
                                                "stream_options": {"include_usage": True}}, headers=auth(1))
    res.check_well_formed("stream with usage")
    u1.append(res.usage())
    after = samples(ctx.port)
    price = PRICES["*"]
    for tenant, us in (("key1", u0), ("key2", u1)):
        pt = sum(u["prompt_tokens"] for u in us)
        ct = sum(u["completion_tokens"] for u in us)
        eq(delta(before, after, "serval_tenant_requests_total", tenant=tenant), len(us), f"{tenant} requests")
        eq(delta(before, after, "serval_tenant_prompt_tokens_total", tenant=tenant), pt, f"{tenant} prompt tokens")
        eq(delta(before, after, "serval_tenant_generation_tokens_total", tenant=tenant), ct, f"{tenant} generated tokens")
        expect = (pt * price["input_per_million"] + ct * price["output_per_million"]) / 1e6
        got = delta(before, after, "serval_tenant_cost_usd_total", tenant=tenant)
        check(math.isclose(got, expect, rel_tol=1e-9), f"{tenant} cost: expected {expect}, got {got}")
        for u in us:
            ext = u.get("serval") or {}
            want = (u["prompt_tokens"] * price["input_per_million"] + u["completion_tokens"] * price["output_per_million"]) / 1e6
            check(math.isclose(ext.get("cost_usd", -1), want, rel_tol=1e-9), f"usage.serval.cost_usd {ext} != {want}")
            check(ext.get("energy_joules", 0) > 0, f"usage.serval.energy_joules should be > 0: {ext}")
            check(math.isclose(ext.get("carbon_grams", -1), ext["energy_joules"] / 3.6e6 * 400, rel_tol=1e-9),
                  f"usage.serval.carbon_grams should be energy/3.6e6*400: {ext}")
        e = delta(before, after, "serval_tenant_energy_joules_total", tenant=tenant)
        check(math.isclose(e, sum(u["serval"]["energy_joules"] for u in us), rel_tol=1e-6),
              f"{tenant} energy counter {e} != sum of usage energy")
    # Energy = engine time share x 1 thread x 12.5 W: never more than all engine time did.
    busy = delta(before, after, "serval_engine_busy_seconds_total")
    total_e = sum(u["serval"]["energy_joules"] for u in u0 + u1)
    check(total_e <= busy * 12.5 * 1.000001, f"attributed energy {total_e} J exceeds engine busy time {busy} s x 12.5 W")


# ------------------------------------------------------------------ logs, state

@suite.test
def json_access_log_has_ids(ctx):
    tp = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
    r = complete(ctx.port, headers={"X-Request-Id": "test-req-42", "traceparent": tp})
    eq(r.header("x-request-id"), "test-req-42", "X-Request-Id echoed")
    r2 = complete(ctx.port, headers={"X-Request-Id": "bad id with spaces"})
    check(r2.header("x-request-id").startswith("req-"), f"unsafe X-Request-Id replaced: {r2.header('x-request-id')}")

    def find():
        for line in ctx.srv.log().splitlines():
            if line.startswith("{") and '"test-req-42"' in line:
                return json.loads(line)
        return None
    entry, _ = wait_until(find, timeout=5)
    check(entry is not None, f"no JSON access-log line with request_id test-req-42 in: {short(ctx.srv.log()[-2000:])}")
    eq(entry["request_id"], "test-req-42", "log request_id")
    eq(entry["trace_id"], TRACE_ID, "log trace_id (propagated from traceparent)")
    eq(entry["status"], 200, "log status")
    eq(entry["path"], "/v1/completions", "log path")
    eq(entry["tenant"], "key1", "log tenant")
    check(entry["completion_tokens"] == 4 and entry["duration_s"] > 0, f"log entry: {entry}")
    check(len(entry["span_id"]) == 16 and entry["span_id"] != PARENT_SPAN, f"log span_id: {entry}")


@suite.test
def engine_state_is_protected(ctx):
    eq(get(ctx.port, "/v1/engine/state").status, 401, "GET /v1/engine/state without a key")
    complete(ctx.port, max_tokens=2)
    complete(ctx.port, max_tokens=2)  # same prompt: a prefix-cache lookup (short prompt: no full block to hit)
    r = get(ctx.port, "/v1/engine/state", headers=auth())
    eq(r.status, 200, "GET /v1/engine/state")
    j = r.json()
    m = samples(ctx.port)
    eq(j["kv_cache"]["blocks_total"], val(m, "serval_kv_blocks_capacity"), "blocks_total vs /metrics")
    eq(j["requests"]["running"], 0, "running when idle")
    eq(j["requests"]["waiting"], 0, "waiting when idle")
    eq(j["kv_cache"]["blocks_used"], 0, "blocks used when idle")
    # No --kv-type: f16 by default, as in llama.cpp (stories260K: 5 layers x K,V x kv_dim 32 x 2 bytes).
    eq(j["kv_cache"]["type"], "f16", "the default KV cache type")
    eq(j["kv_cache"]["bytes_per_token"], 5 * 2 * 32 * 2, "KV bytes per token at f16")
    pc = j["prefix_cache"]
    check(pc["query_tokens"] > 0 and 0 <= pc["hit_rate"] <= 1, f"prefix_cache: {pc}")
    eq(pc["hit_rate"], pc["hit_tokens"] / pc["query_tokens"], "hit_rate = hit_tokens / query_tokens")


@suite.test
def engine_state_counts_running_requests(ctx):
    # Deterministic, whatever the machine's load: the engine is paused, so the
    # request waits; a helper thread steps the engine one iteration at a time
    # until the stream's first token arrives (the prefill step); the state is
    # read while the engine is parked after that step, then it resumes.
    eq(post(ctx.port, "/v1/engine/pause", {}, headers=auth()).status, 200, "pause")
    seen = {}
    first = threading.Event()

    def stepper():
        deadline = time.monotonic() + 30
        while not first.is_set() and time.monotonic() < deadline:
            eq(post(ctx.port, "/v1/engine/step", {"steps": 1}, headers=auth()).status, 200, "step")
            first.wait(0.02)

    def on_event(res, ev):
        if "state" not in seen:
            first.set()
            seen["state"] = get(ctx.port, "/v1/engine/state", headers=auth()).json()
            post(ctx.port, "/v1/engine/resume", {}, headers=auth())
        return True
    t = threading.Thread(target=stepper)
    t.start()
    h = dict(auth(1))
    h["X-Request-Id"] = "state-probe-7"
    try:
        res = stream(ctx.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 40, "stream": True,
                                                   "ignore_eos": True}, headers=h, on_event=on_event)
    finally:
        post(ctx.port, "/v1/engine/resume", {}, headers=auth())
        first.set()
        t.join()
    res.check_well_formed("stream")
    st = seen["state"]
    eq(st["requests"]["http_in_flight"], 1, "in flight during a stream")
    eq(st["requests"]["in_flight_total"], 1, "in_flight_total during a stream")
    eq(len(st["requests"]["in_flight"]), 1, "requests listed during a stream")
    r = st["requests"]["in_flight"][0]
    eq(r["request_id"], "state-probe-7", "listed request_id")
    eq(r["tenant"], "key2", "listed tenant")
    eq(r["id"], res.events[0]["id"], "listed id = the response id")
    eq(r["phase"], "generating", "phase once the first token went out")
    eq(r["prompt_tokens"], 5, "listed prompt tokens")
    check(r["stream"] is True and 1 <= r["completion_tokens"] <= 40 and r["age_s"] > 0, f"listed request: {r}")
    check(st["requests"]["running"] + st["requests"]["waiting"] == 1, f"one sequence in the engine: {st}")
    check(st["kv_cache"]["blocks_used"] >= 1, f"blocks used during a stream: {st}")


@suite.test
def vllm_metric_names_for_routers(ctx):
    # `--metrics-compat vllm`: the Gateway API Inference Extension's signals
    # under vLLM's names, equal to serval's own at the same scrape, read while
    # three requests are in the engine (paused, then one step: prefilled,
    # running). The default server has none of them (promtool lints colons).
    base = parse_metrics(scrape(ctx.port))[0]
    check(not any(n.startswith("vllm:") for n in base), "no vllm: names without the flag")
    with Server("--metrics-compat", "vllm", "--engine-control", name="obs-vllm") as srv:
        eq(post(srv.port, "/v1/engine/pause", {}).status, 200, "pause")
        body = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}
        results = []
        threads = [threading.Thread(target=lambda: results.append(post(srv.port, "/v1/completions", body)))
                   for _ in range(3)]
        for t in threads:
            t.start()
        try:
            wait_in_engine(srv.port, 3)
            m, _, types = parse_metrics(get(srv.port, "/metrics").body.decode())
        finally:
            post(srv.port, "/v1/engine/resume", {})
            for t in threads:
                t.join(60)
        eq([r.status for r in results], [200] * 3, "the requests complete")

        def one(name):
            check(name in m, f"{name} missing")
            eq(len(m[name]), 1, f"one sample of {name}")
            return m[name][0]
        for alias, own in (("vllm:num_requests_running", "serval_requests_running"),
                           ("vllm:num_requests_waiting", "serval_requests_waiting"),
                           ("vllm:kv_cache_usage_perc", "serval_kv_usage_ratio"),
                           ("vllm:gpu_cache_usage_perc", "serval_kv_usage_ratio")):
            labels, v = one(alias)
            eq(v, one(own)[1], f"{alias} = {own}")
            eq(labels, {"model_name": "llama"}, f"{alias} labels")
            eq(types[alias], "gauge", f"{alias} type")
        eq(one("vllm:num_requests_running")[1] + one("vllm:num_requests_waiting")[1], 3.0, "three requests in the engine")
        check(0 < one("vllm:kv_cache_usage_perc")[1] < 1, "KV in use")
        labels, v = one("vllm:cache_config_info")
        eq((labels["block_size"], float(labels["num_gpu_blocks"]), v), ("16", one("serval_kv_blocks_capacity")[1], 1.0),
           "cache_config_info")
        labels, v = one("vllm:lora_requests_info")
        eq(labels, {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}, "no LoRA served")
        check(abs(v - time.time()) < 60, f"lora_requests_info value is the scrape time: {v}")


@suite.test
def engine_control_routes(ctx):
    # API key required; step only while paused; steps bounded; GET refused.
    check_error_body(post(ctx.port, "/v1/engine/pause", {}), 401, "pause without a key")
    check_error_body(post(ctx.port, "/v1/engine/step", {}, headers=auth()), 409, "step while running",
                     code="not_paused")
    eq(get(ctx.port, "/v1/engine/pause", headers=auth()).status, 405, "GET /v1/engine/pause")
    eq(post(ctx.port, "/v1/engine/pause", {}, headers=auth()).json(), {"paused": True}, "pause")
    try:
        for bad in ({"steps": 0}, {"steps": 1001}, {"steps": "2"}, [1]):
            check_error_body(post(ctx.port, "/v1/engine/step", bad, headers=auth()), 400, f"step {bad}")
        eq(post(ctx.port, "/v1/engine/step", {"steps": 3}, headers=auth()).json(), {"paused": True}, "step 3")
    finally:
        eq(post(ctx.port, "/v1/engine/resume", {}, headers=auth()).json(), {"paused": False}, "resume")
    complete(ctx.port)  # serving again


# ------------------------------------------------------------------ Prometheus

@suite.test
def prometheus_scrapes_ttft_histogram(ctx):
    prom = shutil.which("prometheus")
    check(prom is not None, "prometheus not found (Debian package 'prometheus')")
    for _ in range(3):
        complete(ctx.port)
    d = tempfile.mkdtemp(prefix="prom-", dir=ctx.tmp)
    cfg = os.path.join(d, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: serval
    authorization:
      credentials: {KEYS[0]}
    static_configs:
      - targets: ['127.0.0.1:{ctx.port}']
""")
    port = free_port()
    log = open(os.path.join(d, "prom.log"), "wb")
    cmd = [prom, f"--config.file={cfg}", f"--storage.tsdb.path={d}/data", f"--web.listen-address=127.0.0.1:{port}"]
    if shutil.which("setpriv"):
        cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + cmd
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        q = 'histogram_quantile(0.99, sum by (le) (serval_time_to_first_token_seconds_bucket{job="serval"}))'

        def query():
            try:
                url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
                with urllib.request.urlopen(url, timeout=2) as resp:
                    j = json.load(resp)
            except Exception:  # noqa: BLE001
                return None
            res = j.get("data", {}).get("result", [])
            return res[0]["value"][1] if j.get("status") == "success" and res else None
        v, waited = wait_until(query, timeout=30, interval=0.25)
        with open(os.path.join(d, "prom.log"), "rb") as f:
            tail = f.read()[-1500:].decode(errors="replace")
        check(waited is not None, f"Prometheus returned no value for {q} within 30 s; its log: {tail}")
        x = float(v)
        check(0 < x <= 160, f"p99 TTFT from Prometheus should be a positive bucket-interpolated value, got {v}")
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()


@suite.test
def promtool_check_rules(ctx):
    p = subprocess.run([promtool(), "check", "rules", RULES], capture_output=True, timeout=30)
    out = (p.stdout + p.stderr).decode()
    eq(p.returncode, 0, f"promtool check rules {RULES}: {short(out)}")
    check("SUCCESS" in out, f"promtool check rules: {short(out)}")
    # The alerts fire on a synthetic series that burns the budget, and stay quiet on a healthy one.
    p = subprocess.run([promtool(), "test", "rules", RULES_TEST], capture_output=True, timeout=60,
                       cwd=os.path.dirname(RULES_TEST))
    out = (p.stdout + p.stderr).decode()
    eq(p.returncode, 0, f"promtool test rules {RULES_TEST}: {short(out, 3000)}")


# ------------------------------------------------------------------ tracing

class Collector:
    """An OTLP/HTTP JSON receiver on loopback (POST /v1/traces)."""

    def __init__(self):
        self.spans = []
        self.posts = 0
        self.lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                ok = self.path == "/v1/traces" and self.headers.get("Content-Type", "").startswith("application/json")
                if ok:
                    doc = json.loads(body)
                    with outer.lock:
                        outer.posts += 1
                        for rs in doc["resourceSpans"]:
                            svc = [a["value"]["stringValue"] for a in rs["resource"]["attributes"]
                                   if a["key"] == "service.name"]
                            for ss in rs["scopeSpans"]:
                                for s in ss["spans"]:
                                    s["_service"] = svc[0] if svc else None
                                    outer.spans.append(s)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def of_trace(self, trace_id):
        with self.lock:
            return [s for s in self.spans if s["traceId"] == trace_id]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def attrs(span):
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        out[a["key"]] = next(iter(v.values()))
    return out


@suite.test
def otlp_spans_with_propagated_trace(ctx):
    col = Collector()
    try:
        with Server("--otlp-endpoint", f"http://127.0.0.1:{col.port}/v1/traces", "--max-batch-tokens", "8",
                    name="otlp") as srv:
            tp = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
            long_prompt = " ".join(["Once upon a time there was a little dog"] * 3)  # > 8 tokens: chunked prefill
            res = stream(srv.port, "/v1/completions", {"prompt": long_prompt, "max_tokens": 5, "stream": True,
                                                       "ignore_eos": True}, headers={"traceparent": tp})
            res.check_well_formed("traced stream")
            r = post(srv.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})  # no traceparent: a new trace
            eq(r.status, 200, "untraced completion")
            unsampled = "00-11111111111111111111111111111111-2222222222222222-00"
            eq(post(srv.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2},
                    headers={"traceparent": unsampled}).status, 200, "unsampled completion")

            spans, waited = wait_until(lambda: (lambda s: s if any(x["kind"] == 2 for x in s) else None)(
                col.of_trace(TRACE_ID)), timeout=10)
            check(waited is not None, f"no server span for trace {TRACE_ID} within 10 s (got {len(col.spans)} spans)")
            time.sleep(0.2)
            spans = col.of_trace(TRACE_ID)
            server = [s for s in spans if s["kind"] == 2]
            eq(len(server), 1, "server spans in the trace")
            root = server[0]
            eq(root.get("parentSpanId"), PARENT_SPAN, "server span's parent = the caller's span (traceparent)")
            eq(root["name"], "POST /v1/completions", "server span name")
            eq(root["_service"], "serval", "service.name")
            a = attrs(root)
            eq(a.get("http.response.status_code"), "200", "status attribute (OTLP int64 as a string)")
            children = [s for s in spans if s is not root]
            names = sorted(s["name"] for s in children)
            for want in ("queue", "prefill", "decode", "detokenize"):
                check(want in names, f"no '{want}' span among {names}")
            for s in children:
                eq(s.get("parentSpanId"), root["spanId"], f"{s['name']} span's parent")
                check(int(root["startTimeUnixNano"]) <= int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"])
                      <= int(root["endTimeUnixNano"]), f"{s['name']} span outside its parent: {s} vs {root}")
            ids = [s["spanId"] for s in spans]
            eq(len(set(ids)), len(ids), "span ids unique")
            prefill = sorted((s for s in children if s["name"] == "prefill"), key=lambda s: int(s["startTimeUnixNano"]))
            check(len(prefill) >= 2, f"a prompt longer than --max-batch-tokens 8 should prefill in chunks: {len(prefill)}")
            check(sum(int(attrs(s)["serval.prefill.tokens"]) for s in prefill) >= 24, "prefill chunk tokens")
            queue = [s for s in children if s["name"] == "queue"][0]
            check(int(queue["endTimeUnixNano"]) <= int(prefill[0]["startTimeUnixNano"]) + 1000,
                  "queueing ends before the first prefill chunk")
            decode = [s for s in children if s["name"] == "decode"][0]
            eq(attrs(decode).get("gen_ai.usage.output_tokens"), "5", "decode span output tokens")

            def other():
                with col.lock:
                    return [s for s in col.spans if s["kind"] == 2 and s["traceId"] != TRACE_ID]
            others, _ = wait_until(other, timeout=5)
            check(others, "the request without traceparent got no server span")
            for s in others:
                check("parentSpanId" not in s or not s["parentSpanId"], f"a new trace's server span has a parent: {s}")
                check(s["traceId"] != "11111111111111111111111111111111", "an unsampled traceparent was exported")
            eq(col.of_trace("11111111111111111111111111111111"), [], "spans of the unsampled trace")
            # Scrapes and probes start no traces of their own.
            get(srv.port, "/metrics")
            get(srv.port, "/health")
            time.sleep(1.5)
            with col.lock:
                probes = [s["name"] for s in col.spans if s["name"] in ("GET /metrics", "GET /health")]
            eq(probes, [], "spans of untraced scrapes and probes")
    finally:
        col.close()


@suite.test
def absent_collector_never_fails_requests(ctx):
    # Nothing listens on this port: every export fails, spans are dropped and counted.
    dead = free_port()
    with Server("--otlp-endpoint", f"http://127.0.0.1:{dead}", name="otlp-dead") as srv:
        t0 = time.monotonic()
        for _ in range(4):
            eq(post(srv.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3}).status, 200, "completion")
        elapsed = time.monotonic() - t0
        check(elapsed < 5, f"4 tiny completions took {elapsed:.1f} s with a dead collector")

        def dropped():
            s, _, _ = parse_metrics(get(srv.port, "/metrics").body.decode())
            v = s.get("serval_otlp_spans_dropped_total")
            return v[0][1] if v and v[0][1] > 0 else None
        v, waited = wait_until(dropped, timeout=10, interval=0.2)
        check(waited is not None, "serval_otlp_spans_dropped_total stayed 0 with no collector")
        s, _, _ = parse_metrics(get(srv.port, "/metrics").body.decode())
        check(s["serval_otlp_export_failures_total"][0][1] >= 1, "export failures counted")
        eq(s["serval_otlp_spans_exported_total"][0][1], 0, "spans exported with no collector")


@suite.test
def bad_observability_flags_exit_cleanly(ctx):
    bad = [["--otlp-endpoint", "https://collector:4318"], ["--otlp-endpoint", "http://:99999"],
           ["--log-format", "xml"], ["--slo-availability", "100"], ["--price-table", "/nonexistent/prices.json"]]
    tmp = os.path.join(ctx.tmp, "bad-prices.json")
    with open(tmp, "w") as f:
        f.write('{"m": {"input_per_million": -1}}')
    bad.append(["--price-table", tmp])
    for args in bad:
        p = subprocess.run([Config.serval, "serve", "-m", Config.model(), "--port", "0"] + args,
                           capture_output=True, timeout=60)
        err = p.stderr.decode()
        check(p.returncode != 0, f"{args}: expected a non-zero exit, got 0")
        check(err.strip() and len(err.strip().splitlines()) <= 3, f"{args}: expected a short message, got {short(err)}")


if __name__ == "__main__":
    sys.exit(suite.main())
