#!/usr/bin/env python3
"""Table-driven bad requests against `serval serve`: each case asserts the 4xx
status, an OpenAI-style JSON error body {"error": {"message", "type", "param",
"code"}} and that the server is still alive afterwards, while a canary client
keeps running greedy requests that must not be affected. Also: API keys (401 on
every route but /health) and slow-loris clients (408 or closed after
--read-timeout while others are served)."""

import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import (  # noqa: E402
    Config, Server, Suite, check, check_error_body, eq, get, parse_raw_response, post, read_all, request,
    short, stream)

suite = Suite("server_bad_requests")

N_VOCAB = 512      # stories260K
CTX = 256          # -c below: small, so "longer than the context" is cheap
MAX_BODY = 2 << 20
MAX_HEADER = 8192
READ_TIMEOUT = 2
MAX_N = 8
C, H = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
CANARY = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
CANARY_TEXT = ", there was a little girl named Lily"


class Canary:
    """Greedy requests in a loop (streaming and not) on their own connections."""

    def __init__(self, port):
        self.port = port
        self.n_ok = 0
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                if i % 2:
                    r = post(self.port, C, CANARY, timeout=30)
                    if r.status != 200 or r.json()["choices"][0]["text"] != CANARY_TEXT:
                        self.errors.append(f"canary {i}: {r.status} {short(r.body, 300)}")
                    else:
                        self.n_ok += 1
                else:
                    s = stream(self.port, C, dict(CANARY, stream=True), timeout=30)
                    if s.status != 200 or not s.done or s.text() != CANARY_TEXT:
                        self.errors.append(f"canary stream {i}: {s.status} done={s.done} text={s.text()!r} "
                                           f"err={s.error!r} {short(s.body, 200)}")
                    else:
                        self.n_ok += 1
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"canary {i}: {e!r}")
            time.sleep(0.02)

    def finish(self):
        self.stop.set()
        self.thread.join(60)


class Ctx:
    pass


@suite.setup
@contextlib.contextmanager
def setup():
    with Server("-c", str(CTX), "--max-body-bytes", str(MAX_BODY), "--max-header-bytes", str(MAX_HEADER),
                "--read-timeout", str(READ_TIMEOUT), "--max-n", str(MAX_N), name="bad") as srv:
        ctx = Ctx()
        ctx.srv = srv
        ctx.port = srv.port
        ctx.canary = Canary(srv.port)
        ctx.canary.thread.start()
        try:
            yield ctx
        finally:
            ctx.canary.finish()


def raw_request(port, method, path, body=b"", headers=None, timeout=15):
    """Sends one request on a fresh socket (the body from a thread, so a server
    that answers early and closes cannot block us) and parses the answer."""
    headers = dict(headers or {})
    headers.setdefault("Host", "127.0.0.1")
    headers.setdefault("Connection", "close")
    if body is not None and "Content-Length" not in headers and "Transfer-Encoding" not in headers:
        headers["Content-Length"] = str(len(body))
    if body and "Content-Type" not in headers:
        headers["Content-Type"] = "application/json"
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        def send():
            try:
                s.sendall(head.encode("latin-1") + (body or b""))
            except OSError:
                pass
        t = threading.Thread(target=send, daemon=True)
        t.start()
        data = read_all(s, timeout)
        t.join(timeout)
        resp = parse_raw_response(data)
        check(resp is not None, f"{method} {path}: the server closed the connection without an answer")
        return resp
    finally:
        s.close()


def to_bytes(body):
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


def assert_alive(ctx, what):
    check(ctx.srv.alive(), f"the server died after {what} (exit {ctx.srv.proc.returncode}); log:\n{ctx.srv.log()[-2000:]}")
    r = get(ctx.port, "/health", timeout=10)
    eq(r.status, 200, f"GET /health after {what}")


# ------------------------------------------------------------------ the table

def nested(depth):
    return b'{"prompt": "x", "user": ' + b"[" * depth + b"]" * depth + b"}"


class Case:
    def __init__(self, name, path, body, status=400, param=None, code=None, method="POST", headers=None):
        self.name, self.path, self.body, self.status = name, path, body, status
        self.param, self.code, self.method, self.headers = param, code, method, headers


def wrong_type_cases():
    cases = []
    for field, value, path in [
        ("prompt", 5, C), ("prompt", {"a": 1}, C), ("prompt", [1.5], C), ("prompt", [[1, "a"]], C),
        ("prompt", True, C), ("temperature", "hot", C), ("temperature", [1], H), ("n", "2", C), ("n", 1.5, C),
        ("stop", 5, C), ("stop", [1, 2], H), ("stop", {"a": "b"}, C), ("max_tokens", "10", C),
        ("max_tokens", 2.5, H), ("max_completion_tokens", "10", H), ("stream", "yes", C), ("stream", 1, H),
        ("echo", 1, C), ("logprobs", "x", C), ("logprobs", 5, H), ("logprobs", True, C), ("top_logprobs", "3", H),
        ("seed", "x", C), ("seed", 1.5, C), ("top_p", "x", C), ("top_k", "x", C), ("top_k", 1.5, H),
        ("presence_penalty", "x", C), ("frequency_penalty", [0], H), ("logit_bias", [], C),
        ("logit_bias", "x", H), ("logit_bias", {"1": "x"}, C), ("stream_options", "x", C),
        ("model", 5, C), ("model", ["m"], H), ("ignore_eos", "no", C), ("best_of", "2", C),
        ("stop_token_ids", [1.5], C), ("stop_token_ids", 5, C),
    ]:
        body = {"prompt": "Once upon a time"} if path == C else {"messages": MSG}
        body[field] = value
        if field == "top_logprobs":
            body["logprobs"] = True
        cases.append(Case(f"wrong type {field}={json.dumps(value)} ({path})", path, body, param=field))
    cases += [
        Case("stream_options without stream", C, {"prompt": "x", "stream_options": {"include_usage": True}},
             param="stream_options"),
        Case("messages is a string", H, {"messages": "hi"}, param="messages"),
        Case("messages of strings", H, {"messages": ["hi"]}, param="messages"),
        Case("message content is a number", H, {"messages": [{"role": "user", "content": 5}]}, param="messages"),
        Case("message without role", H, {"messages": [{"content": "hi"}]}, param="messages"),
        Case("message role is a number", H, {"messages": [{"role": 1, "content": "hi"}]}, param="messages"),
        Case("unknown role", H, {"messages": [{"role": "wizard", "content": "hi"}]}, param="messages"),
        Case("top_logprobs without logprobs", H, {"messages": MSG, "top_logprobs": 3}, param="top_logprobs"),
    ]
    return cases


def range_cases():
    p = {"prompt": "Once upon a time"}
    m = {"messages": MSG}
    long_ids = [1] + [400] * (CTX + 10)
    return [
        Case("empty prompt string", C, dict(p, prompt=""), param="prompt"),
        Case("empty prompt array", C, dict(p, prompt=[]), param="prompt"),
        Case("empty prompt in a list", C, dict(p, prompt=[""]), param="prompt"),
        Case("empty token list in a list", C, dict(p, prompt=[[]]), param="prompt"),
        Case("missing prompt", C, {"max_tokens": 3}, param="prompt"),
        Case("empty messages", H, {"messages": []}, param="messages"),
        Case("missing messages", H, {"max_tokens": 3}, param="messages"),
        Case("token id -1", C, dict(p, prompt=[1, 403, -1]), param="prompt"),
        Case("token id = n_vocab", C, dict(p, prompt=[1, N_VOCAB]), param="prompt"),
        Case("token id 2^40", C, dict(p, prompt=[1, 1 << 40]), param="prompt"),
        Case("token id -1 in a list of lists", C, dict(p, prompt=[[1, 2], [1, -1]]), param="prompt"),
        Case("n = 10^6", C, dict(p, n=10 ** 6), param="n"),
        Case("n = 2^64", H, dict(m, n=2 ** 64), param="n"),
        Case("n = 0", C, dict(p, n=0), param="n"),
        Case("n = -1", H, dict(m, n=-1), param="n"),
        Case(f"n = {MAX_N + 1} > --max-n", C, dict(p, n=MAX_N + 1), param="n"),
        Case("best_of > n", C, dict(p, n=1, best_of=3), param="best_of"),
        Case("best_of huge", C, dict(p, n=2, best_of=10 ** 9), param="best_of"),
        Case("max_tokens negative", C, dict(p, max_tokens=-5), param="max_tokens"),
        Case("max_tokens 0", C, dict(p, max_tokens=0), param="max_tokens"),
        Case("max_tokens 2^31", C, dict(p, max_tokens=2 ** 31), param="max_tokens"),
        Case("max_tokens 1e30", H, dict(m, max_tokens=1e30), param="max_tokens"),
        Case("max_tokens past the context", C, dict(p, max_tokens=CTX), param="max_tokens",
             code="context_length_exceeded"),
        Case("max_completion_tokens past the context", H, dict(m, max_completion_tokens=10 * CTX),
             param="max_tokens", code="context_length_exceeded"),
        Case("prompt ids longer than the context", C, dict(p, prompt=long_ids), param="prompt",
             code="context_length_exceeded"),
        Case("prompt text longer than the context", C, dict(p, prompt="Once upon a time " * 200), param="prompt",
             code="context_length_exceeded"),
        Case("chat prompt longer than the context", H, {"messages": [{"role": "user", "content": "cat " * 400}]},
             param="messages", code="context_length_exceeded"),
        Case("stop with 1,000 strings", C, dict(p, stop=["x"] * 1000), param="stop"),
        Case("stop with 17 strings", H, dict(m, stop=[f"s{i}" for i in range(17)]), param="stop"),
        Case("stop with one 1 MB string", C, dict(p, stop="a" * (1 << 20)), status=(400, 413)),
        Case("stop with one 1 MB string in a list", H, dict(m, stop=["b" * (1 << 20)]), status=(400, 413)),
        Case("empty stop string", C, dict(p, stop=[""])),
        Case("logit_bias id = n_vocab", C, dict(p, logit_bias={str(N_VOCAB): 1}), param="logit_bias"),
        Case("logit_bias id -1", H, dict(m, logit_bias={"-1": 1}), param="logit_bias"),
        Case("logit_bias id 2^70", C, dict(p, logit_bias={str(2 ** 70): 1}), param="logit_bias"),
        Case("logit_bias id not a number", C, dict(p, logit_bias={"abc": 1}), param="logit_bias"),
        Case("logit_bias bias 1000", C, dict(p, logit_bias={"5": 1000})),
        Case("logit_bias with 10^6 entries", C, dict(p, logit_bias={str(i): 1 for i in range(10 ** 6)}),
             status=(400, 413)),
        Case("logit_bias with 2,000 entries", C, dict(p, logit_bias={str(i % N_VOCAB + (i // N_VOCAB) * 10 ** 6): 1
                                                                     for i in range(2000)}), param="logit_bias"),
        Case("top_logprobs huge", H, dict(m, logprobs=True, top_logprobs=10 ** 9), param="top_logprobs"),
        Case("top_logprobs 21", H, dict(m, logprobs=True, top_logprobs=21), param="top_logprobs"),
        Case("top_logprobs -1", H, dict(m, logprobs=True, top_logprobs=-1), param="top_logprobs"),
        Case("logprobs 21", C, dict(p, logprobs=21), param="logprobs"),
        Case("logprobs 10^6", C, dict(p, logprobs=10 ** 6), param="logprobs"),
        Case("logprobs -1", C, dict(p, logprobs=-1), param="logprobs"),
        Case("temperature -1", C, dict(p, temperature=-1), param="temperature"),
        Case("temperature 1e9", H, dict(m, temperature=1e9), param="temperature"),
        Case("top_p 0", C, dict(p, top_p=0), param="top_p"),
        Case("top_p 1.5", C, dict(p, top_p=1.5), param="top_p"),
        Case("top_k -2", C, dict(p, top_k=-2), param="top_k"),
        Case("frequency_penalty 3", H, dict(m, frequency_penalty=3), param="frequency_penalty"),
        Case("presence_penalty -3", C, dict(p, presence_penalty=-3), param="presence_penalty"),
        Case("stop_token_ids out of range", C, dict(p, stop_token_ids=[N_VOCAB]), param="stop_token_ids"),
        Case("suffix (unsupported)", C, dict(p, suffix="The end."), param="suffix"),
        Case("logit_bias bias 1e300 (past float)", C, dict(p, logit_bias={"5": 1e300})),
        Case("temperature 1e300 (past float)", H, dict(m, temperature=1e300), param="temperature"),
    ]


def template_cases():
    """The chat template is the operator's: a request cannot bring or parameterise one."""
    p = {"prompt": "Once upon a time"}
    m = {"messages": MSG}
    ssti = "{{ cycler.__init__.__globals__.os.popen('id').read() }}"
    return [
        Case("chat_template in the request", H, dict(m, chat_template=ssti), param="chat_template"),
        Case("chat_template_kwargs in the request", H, dict(m, chat_template_kwargs={"enable_thinking": True}),
             param="chat_template_kwargs"),
        Case("chat_template on completions", C, dict(p, chat_template="{{ 7 * 7 }}"), param="chat_template"),
        Case("template field", H, dict(m, template="{% for x in range(10**9) %}{% endfor %}"), param="template"),
    ]


def syntax_cases():
    return [
        Case("malformed JSON", C, b'{"prompt": "x",, "max_tokens": 3}'),
        Case("malformed JSON (chat)", H, b'{"messages": [{"role": "user" "content": "hi"}]}'),
        Case("truncated JSON", C, b'{"prompt": "Once upon'),
        Case("truncated JSON (chat)", H, b'{"messages": [{"role": "user", "content": "hi"'),
        Case("empty body", C, b""),
        Case("JSON array body", C, b"[1, 2, 3]"),
        Case("JSON string body", H, b'"hello"'),
        Case("JSON null body", C, b"null"),
        Case("trailing garbage after JSON", C, b'{"prompt": "x"} xyz'),
        Case("10,000-level nested arrays", C, nested(10000)),
        Case("10,000-level nested objects", H, b'{"messages": ' + b'{"a":' * 10000 + b"1" + b"}" * 10000 + b"}"),
        Case("10,000 unclosed brackets", C, b'{"prompt": ' + b"[" * 10000),
        Case("10,000-level nesting on /tokenize", "/tokenize", nested(10000)),
        Case("10,000-level nesting on /detokenize", "/detokenize",
             b'{"tokens": [1], "x": ' + b"[" * 10000 + b"]" * 10000 + b"}"),
        Case("invalid UTF-8 in the prompt", C, b'{"prompt": "Once \xff\xfe upon", "max_tokens": 3}'),
        Case("invalid UTF-8 in a message", H, b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'),
        Case("overlong UTF-8 encoding", C, b'{"prompt": "\xc0\xaf", "max_tokens": 3}'),
        Case("invalid UTF-8 in a key", C, b'{"\xff": 1, "prompt": "x"}'),
        Case("invalid UTF-8 on /tokenize", "/tokenize", b'{"prompt": "\xed\xa0\x80"}'),
        Case("lone surrogate escape", C, b'{"prompt": "a\\ud800b"}'),
        Case("NaN literal", C, b'{"prompt": "x", "temperature": NaN}'),
        Case("number overflow", C, b'{"prompt": "x", "temperature": 1e999}'),
        Case("tokenize: prompt is a number", "/tokenize", {"prompt": 5}, param="prompt"),
        Case("tokenize: array body", "/tokenize", b"[]"),
        Case("detokenize: id -1", "/detokenize", {"tokens": [1, -1]}, param="tokens"),
        Case("detokenize: id = n_vocab", "/detokenize", {"tokens": [N_VOCAB]}, param="tokens"),
        Case("detokenize: tokens is a string", "/detokenize", {"tokens": "abc"}, param="tokens"),
        Case("detokenize: no tokens", "/detokenize", {}, param="tokens"),
    ]


def route_cases():
    p = {"prompt": "x", "max_tokens": 1}
    cases = [
        Case("unknown model", C, dict(p, model="gpt-4"), status=404, param="model", code="model_not_found"),
        Case("unknown model (chat)", H, {"messages": MSG, "model": "no-such-model"}, status=404, param="model",
             code="model_not_found"),
        Case("unknown route GET /v1/nope", "/v1/nope", None, status=404, method="GET"),
        Case("unknown route POST /v1/engines/x/completions", "/v1/engines/x/completions", p, status=404),
        # (GET / is the browser UI: tests/server/test_webui.py)
        Case("unknown route GET /index.htm", "/index.htm", None, status=404, method="GET"),
        Case("unknown route GET /assets", "/assets", None, status=404, method="GET"),
        Case("engine control is off without --engine-control", "/v1/engine/pause", {}, status=404),
        Case("unknown route /v1/completions/extra", "/v1/completions/extra", p, status=404),
    ]
    for method, path in [("GET", C), ("PUT", C), ("GET", H), ("DELETE", H), ("POST", "/v1/models"),
                         ("DELETE", "/v1/models"), ("GET", "/tokenize"), ("GET", "/detokenize"),
                         ("POST", "/health")]:
        cases.append(Case(f"wrong method {method} {path}", path, None if method in ("GET", "DELETE") else p,
                          status=405, method=method))
    return cases


def run_case(ctx, c):
    body = None if c.body is None else to_bytes(c.body)
    resp = raw_request(ctx.port, c.method, c.path, body, c.headers, timeout=30)
    e = check_error_body(resp, c.status, c.name, param=c.param, code=c.code)
    check(resp.status < 500, f"{c.name}: a server error ({resp.status}) for a client mistake")
    return e


def run_table(ctx, cases):
    failures = []
    for c in cases:
        try:
            run_case(ctx, c)
        except AssertionError as e:
            failures.append(str(e))
        assert_alive(ctx, c.name)
    check(not failures, f"{len(failures)} of {len(cases)} cases failed:\n    " + "\n    ".join(
        short(f, 500) for f in failures))


@suite.test
def table_wrong_types(ctx):
    run_table(ctx, wrong_type_cases())


@suite.test
def table_ranges_and_limits(ctx):
    run_table(ctx, range_cases())


@suite.test
def table_templates(ctx):
    run_table(ctx, template_cases())


@suite.test
def table_syntax_and_encoding(ctx):
    run_table(ctx, syntax_cases())


@suite.test
def table_routes_and_methods(ctx):
    run_table(ctx, route_cases())


@suite.test
def wrong_method_allow_header(ctx):
    # RFC 9110 15.5.6: "The origin server MUST generate an Allow header field in a 405 response".
    missing = []
    for c in route_cases():
        if c.status != 405:
            continue
        r = raw_request(ctx.port, c.method, c.path, None if c.body is None else to_bytes(c.body))
        eq(r.status, 405, c.name)
        if not r.header("allow"):
            missing.append(f"{c.method} {c.path}")
    check(not missing, f"405 without an Allow header: {', '.join(missing)}")


# ------------------------------------------------------------------ HTTP-level limits

@suite.test
def body_too_large_413(ctx):
    # Declared length past the limit: refused before the body is read.
    r = raw_request(ctx.port, "POST", C, b'{"prompt": "', {"Content-Length": str(MAX_BODY + 1)})
    check_error_body(r, 413, "Content-Length past --max-body-bytes")
    assert_alive(ctx, "413 (declared)")
    # A real body past the limit (sent while the server answers).
    big = json.dumps({"prompt": "a" * (MAX_BODY + 1000)}).encode()
    r = raw_request(ctx.port, "POST", C, big)
    check_error_body(r, 413, "body past --max-body-bytes")
    assert_alive(ctx, "413 (sent)")
    # Chunked body past the limit.
    chunk = b"x" * 65536
    chunks = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(MAX_BODY // len(chunk) + 2)) + b"0\r\n\r\n"
    r = raw_request(ctx.port, "POST", C, chunks, {"Transfer-Encoding": "chunked"})
    check_error_body(r, 413, "chunked body past --max-body-bytes")
    assert_alive(ctx, "413 (chunked)")
    # Just under the limit is fine (the prompt is then too long for the context: 400, not 413).
    ok = json.dumps({"prompt": "a " * ((MAX_BODY - 100) // 2)}).encode()
    check(len(ok) < MAX_BODY, "test body size")
    r = raw_request(ctx.port, "POST", C, ok)
    check_error_body(r, 400, "body under --max-body-bytes with a prompt past the context", code="context_length_exceeded")
    assert_alive(ctx, "a large body")


@suite.test
def headers_too_large_431(ctx):
    r = raw_request(ctx.port, "POST", C, to_bytes({"prompt": "x"}), {"X-Big": "a" * (MAX_HEADER + 100)})
    check_error_body(r, 431, "one header past --max-header-bytes")
    assert_alive(ctx, "431 (one header)")
    many = {f"X-H{i}": "v" * 40 for i in range(MAX_HEADER // 40)}
    r = raw_request(ctx.port, "GET", "/health", None, many)
    check_error_body(r, 431, "many headers past --max-header-bytes")
    assert_alive(ctx, "431 (many headers)")
    r = raw_request(ctx.port, "GET", "/health?" + "q" * (MAX_HEADER + 100), None)
    check_error_body(r, (414, 431), "request line past --max-header-bytes")
    assert_alive(ctx, "431 (long URL)")


@suite.test
def malformed_http(ctx):
    for name, data in [
        ("garbage request line", b"GARBAGE\r\n\r\n"),
        ("bad Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"),
        ("negative Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"),
        ("two different Content-Lengths",
         b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
        ("bad chunk size", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
        ("bad HTTP version", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n"),
        ("NUL in a header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
    ]:
        s = socket.create_connection(("127.0.0.1", ctx.port), timeout=10)
        try:
            s.sendall(data)
            resp = parse_raw_response(read_all(s, 10))
        finally:
            s.close()
        if resp is not None:  # closing without an answer is acceptable for garbage
            check_error_body(resp, (400, 505), name)
        assert_alive(ctx, name)


# ------------------------------------------------------------------ slow clients

@suite.test
def slow_loris(ctx):
    """Clients that trickle their headers or body, or say nothing, are cut off
    after --read-timeout (408 or closed) while other clients are served."""
    results = {}

    def trickle(name, first, drip, every=0.2, limit=READ_TIMEOUT + 6):
        s = socket.create_connection(("127.0.0.1", ctx.port), timeout=limit)
        t0 = time.monotonic()
        out = b""
        try:
            if first:
                s.sendall(first)
            s.settimeout(every)
            while time.monotonic() - t0 < limit:
                try:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                    continue
                except socket.timeout:
                    pass
                except OSError:
                    break
                if drip:
                    try:
                        s.sendall(drip)
                    except OSError:
                        break
            results[name] = (time.monotonic() - t0, out)
        finally:
            s.close()

    clients = [
        ("headers trickled", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"X: y\r\n"),
        ("body trickled", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n{", b" "),
        ("silent connection", None, None),
    ] + [(f"headers trickled {i}", b"GET /health HTTP/1.1\r\n", b"X-Slow: 1\r\n") for i in range(20)] \
      + [(f"silent connection {i}", None, None) for i in range(50)]
    threads = [threading.Thread(target=trickle, args=c, daemon=True) for c in clients]
    for t in threads:
        t.start()
    time.sleep(0.5)
    # Others are served meanwhile, promptly.
    t0 = time.monotonic()
    r = post(ctx.port, C, CANARY, timeout=10)
    eq(r.status, 200, "a normal request during the slow-loris attack")
    eq(r.json()["choices"][0]["text"], CANARY_TEXT, "its text")
    took = time.monotonic() - t0
    check(took < 2.0 * Config.time_scale, f"a normal request took {took:.2f} s during the slow-loris attack")
    for t in threads:
        t.join(READ_TIMEOUT + 10)
    problems = []
    for name, _, _ in clients:
        if name not in results:
            problems.append(f"{name}: no result")
            continue
        dt, out = results[name]
        if dt > READ_TIMEOUT + 3:
            problems.append(f"{name}: still open {dt:.1f} s later (--read-timeout {READ_TIMEOUT})")
        if dt < READ_TIMEOUT - 0.5:
            problems.append(f"{name}: cut off after only {dt:.1f} s (--read-timeout {READ_TIMEOUT})")
        if out:
            try:
                check_error_body(parse_raw_response(out), 408, name)
            except AssertionError as e:
                problems.append(str(e))
    seen = {}
    for name, _, _ in clients:
        if name in results:
            dt, out = results[name]
            kind = (out.split(b"\r\n", 1)[0].decode("latin-1") if out else "closed") + f" after {dt:.1f} s"
            seen.setdefault(kind.rsplit(" after", 1)[0], []).append(dt)
    print("  slow clients: " + "; ".join(f"{k}: {len(v)} ({min(v):.1f}-{max(v):.1f} s)" for k, v in seen.items()))
    check(not problems, "slow clients: " + "; ".join(problems))
    assert_alive(ctx, "slow-loris clients")


# ------------------------------------------------------------------ the canary

@suite.test
def zz_canary_unaffected(ctx):
    ctx.canary.finish()
    check(not ctx.canary.errors, f"{len(ctx.canary.errors)} canary requests failed during the bad requests: "
          + "; ".join(ctx.canary.errors[:5]))
    check(ctx.canary.n_ok >= 10, f"only {ctx.canary.n_ok} canary requests ran")
    print(f"  {ctx.canary.n_ok} canary requests, all correct")


# ------------------------------------------------------------------ API keys

@suite.test
def api_key_required(_):
    keys = ["sk-test-key-1", "second-key"]
    with Server("--api-key", keys[0], "--api-key", keys[1], name="auth") as srv:
        routes = [("GET", "/v1/models", None), ("POST", C, {"prompt": "x", "max_tokens": 1}),
                  ("POST", H, {"messages": MSG, "max_tokens": 1}), ("POST", "/tokenize", {"prompt": "x"}),
                  ("POST", "/detokenize", {"tokens": [1, 2]}), ("GET", "/ready", None), ("GET", "/metrics", None),
                  ("GET", "/v1/nope", None)]
        bad_auth = [None, "Bearer wrong", f"Bearer {keys[0]}x", f"Bearer {keys[0][:-1]}", "Bearer ",
                    f"Basic {keys[0]}", keys[0], f"bearer{keys[0]}", f"Bearer {keys[0]} {keys[1]}"]
        problems = []
        for method, path, body in routes:
            for auth in bad_auth:
                headers = {} if auth is None else {"Authorization": auth}
                r = request(srv.port, method, path, body=body, headers=headers)
                try:
                    check_error_body(r, 401, f"{method} {path} with Authorization {auth!r}")
                except AssertionError as e:
                    problems.append(str(e))
            if path != "/v1/nope":
                for k in keys:
                    r = request(srv.port, method, path, body=body, headers={"Authorization": f"Bearer {k}"})
                    if r.status != 200:
                        problems.append(f"{method} {path} with a valid key: {r.status} {short(r.body, 200)}")
        s = stream(srv.port, C, {"prompt": "x", "max_tokens": 2, "stream": True})
        if s.status != 401:
            problems.append(f"streaming without a key: {s.status}")
        s = stream(srv.port, C, {"prompt": "x", "max_tokens": 2, "stream": True},
                   headers={"Authorization": f"Bearer {keys[1]}"})
        if not s.done:
            problems.append("streaming with a valid key did not complete")
        r = get(srv.port, "/health")
        if r.status != 200:
            problems.append(f"/health without a key: {r.status} (it must stay open for liveness probes)")
        check(not problems, f"{len(problems)} auth problems:\n    " + "\n    ".join(short(p, 300) for p in problems))


@suite.test
def api_key_file(_):
    fd, path = tempfile.mkstemp(prefix="serval-test-keys-")
    with os.fdopen(fd, "w") as f:
        f.write("key-one\r\n\nkey-two \n")
    try:
        with Server("--api-key-file", path, name="auth-file") as srv:
            for k in ("key-one", "key-two"):
                r = get(srv.port, "/v1/models", headers={"Authorization": f"Bearer {k}"})
                eq(r.status, 200, f"GET /v1/models with key {k!r} from --api-key-file")
            check_error_body(get(srv.port, "/v1/models", headers={"Authorization": "Bearer key-three"}), 401,
                             "a key not in --api-key-file")
            check_error_body(get(srv.port, "/v1/models", headers={"Authorization": "Bearer "}), 401, "an empty key")
    finally:
        os.unlink(path)


@suite.test
def chat_without_template(_):
    with Server(name="no-template", chat_template=None) as srv:
        r = post(srv.port, H, {"messages": MSG, "max_tokens": 2})
        check_error_body(r, 400, "chat on a model without a chat template", code="no_chat_template")
        r = post(srv.port, C, CANARY)
        eq(r.status, 200, "completions still work without a chat template")


if __name__ == "__main__":
    raise SystemExit(suite.main())
