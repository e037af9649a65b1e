#!/usr/bin/env python3
"""The web UI's HTTP side (no browser; tests/webui/ drives Chromium): GET /
and its assets, gzip and identity answers carrying the same bytes, the
Content-Security-Policy and caching headers, every script and stylesheet the
page names served from this origin, no API key needed for the page while the
API still asks for one, the dashboard's JSON (/v1/engine/state latency
histograms, config, build), and the 404/405 answers (unknown asset,
--no-webui, other methods). Skips the asset checks only in a build without
the UI (no npm at build time): then GET / must say so in a 404."""

import contextlib
import gzip
import json
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Server, Suite, check, check_error_body, eq, get, post, request  # noqa: E402

suite = Suite("server_webui")
KEY = "sk-webui-http-test"


@suite.setup
@contextlib.contextmanager
def setup():
    with Server(name="webui-http") as plain, Server("--api-key", KEY, name="webui-http-key") as keyed, \
            Server("--no-webui", name="webui-http-off") as off:
        built = "web UI (chat, dashboard) at" in plain.log()
        yield {"plain": plain.port, "keyed": keyed.port, "off": off.port, "built": built}


def page(port, gz=True):
    return get(port, "/", headers={"Accept-Encoding": "gzip, deflate, br"} if gz else {})


def body_of(r):
    return gzip.decompress(r.body) if r.header("content-encoding") == "gzip" else r.body


@suite.test
def page_and_assets_gzip_and_identity(ports):
    if not ports["built"]:
        r = page(ports["plain"])
        check_error_body(r, 404, "a build without the UI", code="not_found")
        check("built without the web UI" in r.json()["error"]["message"], r.json()["error"]["message"])
        return
    z, plain = page(ports["plain"]), page(ports["plain"], gz=False)
    eq(z.status, 200, "GET / (gzip)")
    eq(z.header("content-encoding"), "gzip", "gzip when the client takes it")
    eq(plain.header("content-encoding"), "", "identity when it does not")
    eq(body_of(z), plain.body, "the same page either way")
    eq(z.header("vary"), "Accept-Encoding", "Vary")
    check(z.header("content-type").startswith("text/html"), z.header("content-type"))
    eq(z.header("cache-control"), "no-cache", "the page is revalidated (its assets are content-hashed)")
    html = plain.body.decode()
    check("<div id=\"app\">" in html, "the app's root element")
    # A gzip q=0 refuses gzip.
    eq(get(ports["plain"], "/", headers={"Accept-Encoding": "gzip;q=0, identity"}).header("content-encoding"), "",
       "gzip;q=0")
    # Every script and stylesheet the page names is ours, served, and cached for a year.
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assets = [u for u in refs if not u.startswith("data:")]
    check(any(u.endswith(".js") for u in assets) and any(u.endswith(".css") for u in assets), f"assets {assets}")
    for u in assets:
        check(u.startswith("/assets/"), f"{u}: served from this origin")
        a, b = get(ports["plain"], u, headers={"Accept-Encoding": "gzip"}), get(ports["plain"], u)
        eq(a.status, 200, u)
        eq(gzip.decompress(a.body), b.body, f"{u}: gzip and identity")
        eq(a.header("cache-control"), "public, max-age=31536000, immutable", f"{u}: cache")
        eq(a.header("x-content-type-options"), "nosniff", u)
        want = "text/javascript" if u.endswith(".js") else "text/css"
        check(a.header("content-type").startswith(want), f"{u}: {a.header('content-type')}")


@suite.test
def content_security_policy(ports):
    if not ports["built"]:
        return
    csp = page(ports["plain"]).header("content-security-policy")
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    eq(directives.get("default-src"), ["'none'"], "default-src")
    eq(directives.get("script-src"), ["'self'"], "script-src: no inline script, no other origin")
    eq(directives.get("connect-src"), ["'self'"], "connect-src")
    eq(directives.get("frame-ancestors"), ["'none'"], "frame-ancestors")
    check("'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp, csp)
    eq(page(ports["plain"]).header("x-frame-options"), "DENY", "X-Frame-Options")


@suite.test
def page_needs_no_key_but_the_api_does(ports):
    r = page(ports["keyed"])
    eq(r.status, 200 if ports["built"] else 404, "GET / without a key")
    check_error_body(get(ports["keyed"], "/v1/engine/state"), 401, "the dashboard's JSON without a key",
                     code="invalid_api_key")
    eq(get(ports["keyed"], "/v1/engine/state", headers={"Authorization": f"Bearer {KEY}"}).status, 200, "with it")


@suite.test
def not_found_and_method_errors(ports):
    check_error_body(get(ports["plain"], "/assets/no-such-file.js"), 404, "unknown asset", code="not_found")
    check_error_body(get(ports["plain"], "/assets/../../etc/passwd"), 404, "no path walking", code="not_found")
    r = post(ports["plain"], "/", {})
    check_error_body(r, 405, "POST /", code="method_not_allowed")
    eq(r.header("allow"), "GET", "Allow")
    r = page(ports["off"])
    check_error_body(r, 404, "--no-webui", code="not_found")
    check("--no-webui" in r.json()["error"]["message"], r.json()["error"]["message"])
    check_error_body(get(ports["off"], "/assets/x.js"), 404, "--no-webui asset", code="not_found")
    eq(get(ports["off"], "/health").status, 200, "the API is still there")


@suite.test
def dashboard_json(ports):
    port = ports["plain"]
    for _ in range(3):
        eq(post(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).status,
           200, "completion")
    s = get(port, "/v1/engine/state").json()
    for name in ("ttft", "itl", "e2e", "queue"):
        h = s["latency"][name]
        eq(len(h["cumulative"]), len(h["bounds"]) + 1, f"{name}: a count per bound and +Inf")
        check(all(a <= b for a, b in zip(h["cumulative"], h["cumulative"][1:])), f"{name}: cumulative")
        check(all(a < b for a, b in zip(h["bounds"], h["bounds"][1:])), f"{name}: sorted bounds")
    eq(s["latency"]["ttft"]["cumulative"][-1], 3, "three first tokens observed")
    eq(s["latency"]["e2e"]["cumulative"][-1], 3, "three requests observed")
    cfg = s["config"]
    for k in ("max_seqs", "max_batch_tokens", "kv_type", "block_size", "context", "threads"):
        check(k in cfg, f"config.{k} in {json.dumps(cfg)}")
    eq(cfg["threads"], 1, "threads (the harness serves with -t 1)")
    eq(cfg["kv_memory_bytes"], 64 << 20, "kv memory (the harness's --kv-memory 64M)")
    b = s["build"]
    check(re.fullmatch(r"\d+\.\d+\.\d+", b["version"]), f"version {b['version']}")
    check(b["kernels"] in ("ref", "avx2", "avx2vnni", "avx512", "avx512vnni"), f"kernels {b['kernels']}")
    check(b["uptime_s"] > 0, "uptime")


if __name__ == "__main__":
    suite.main()
