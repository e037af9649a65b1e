"""Shared pieces of the end-to-end tests of `serval serve` (Python 3 stdlib only).

A test file builds a Suite, registers test functions with @suite.test and calls
suite.main(), which exits the process with 1 when a test failed (so a file that
forgets to pass its result on cannot pass by accident). Each run starts its own servers on 127.0.0.1 (a free port picked
here), waits for GET /health, and kills every server it started on exit, even
when the runner itself is killed (the servers get SIGKILL when it dies, through
PR_SET_PDEATHSIG where `setpriv` is available).

Command line of every test file:
  --serval PATH   the serval binary (default: <repo>/build/serval)
  --shared DIR    the shared test data (default: <repo>/../shared)
  -k SUBSTRING    run only the tests whose name contains it (repeatable)
  -v              print each server's log tail after each failing test
"""

import argparse
import atexit
import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class SkipTest(Exception):
    pass


class Config:
    serval = os.path.join(REPO, "build", "serval")
    shared = os.path.join(REPO, "..", "shared")
    verbose = False
    # Latency bounds in the tests are multiplied by this: a sanitized server
    # (scripts/test-sanitize.sh sets SERVAL_SANITIZED) runs several times slower.
    sanitized = bool(os.environ.get("SERVAL_SANITIZED"))
    time_scale = float(os.environ.get("SERVAL_TIME_SCALE", "4" if os.environ.get("SERVAL_SANITIZED") else "1"))

    @classmethod
    def model(cls):
        return os.path.join(cls.shared, "models", "stories260K.gguf")

    @classmethod
    def chat_template(cls):
        # A short template (no default system prompt): small prompts for the tiny model.
        return os.path.join(cls.shared, "chat-templates", "microsoft-Phi-3.5-mini-instruct.jinja")

    @classmethod
    def golden(cls):
        with open(os.path.join(cls.shared, "golden", "stories260K-greedy.json")) as f:
            return json.load(f)


# ---------------------------------------------------------------- assertions

def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def eq(actual, expected, what):
    if actual != expected:
        raise AssertionError(f"{what}: expected {short(expected)}, got {short(actual)}")


def short(x, n=600):
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + f"... ({len(s)} chars)"


def check_error_body(resp, status=None, what="", param=None, code=None, type_=None):
    """Asserts an OpenAI-style error: status (int or collection), a JSON body
    {"error": {"message": str, "type": str, "param": str|null, "code": str|null}}."""
    what = (what + ": ") if what else ""
    if status is not None:
        ok = resp.status in status if isinstance(status, (set, tuple, list, frozenset)) else resp.status == status
        check(ok, f"{what}expected status {status}, got {resp.status} {short(resp.body.decode('utf-8', 'replace'))}")
    ct = resp.header("content-type")
    check(ct.startswith("application/json"), f"{what}error Content-Type should be application/json, got '{ct}'")
    try:
        j = json.loads(resp.body)
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{what}error body is not JSON ({e}): {short(resp.body)}")
    check(isinstance(j, dict) and isinstance(j.get("error"), dict), f"{what}no 'error' object in {short(j)}")
    e = j["error"]
    for k in ("message", "type", "param", "code"):
        check(k in e, f"{what}error lacks '{k}': {short(j)}")
    check(isinstance(e["message"], str) and e["message"], f"{what}error.message must be a non-empty string: {short(j)}")
    check(isinstance(e["type"], str) and e["type"], f"{what}error.type must be a non-empty string: {short(j)}")
    check(e["param"] is None or isinstance(e["param"], str), f"{what}error.param must be a string or null: {short(j)}")
    check(e["code"] is None or isinstance(e["code"], str), f"{what}error.code must be a string or null: {short(j)}")
    if param is not None:
        eq(e["param"], param, f"{what}error.param")
    if code is not None:
        eq(e["code"], code, f"{what}error.code")
    if type_ is not None:
        eq(e["type"], type_, f"{what}error.type")
    return e


# ---------------------------------------------------------------- HTTP

class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # list of (name, value) as received
        self.body = body

    def header(self, name):
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return ""

    def json(self):
        try:
            return json.loads(self.body)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"response body is not JSON ({e}): {short(self.body)}")

    def __repr__(self):
        return f"<{self.status} {short(self.body.decode('utf-8', 'replace'), 300)}>"


def _encode(body, headers):
    headers = dict(headers or {})
    if body is None:
        return None, headers
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
        headers.setdefault("Content-Type", "application/json")
    return body, headers


def request(port, method, path, body=None, headers=None, timeout=60):
    body, headers = _encode(body, headers)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, r.getheaders(), data)
    finally:
        conn.close()


def get(port, path, **kw):
    return request(port, "GET", path, **kw)


def post(port, path, body, **kw):
    return request(port, "POST", path, body=body, **kw)


class StreamResult:
    def __init__(self):
        self.status = None
        self.headers = []
        self.events = []      # parsed JSON of each `data: {...}` line
        self.done = False     # saw `data: [DONE]`
        self.after_done = []  # anything that came after [DONE]
        self.bad_lines = []   # lines that are neither `data: ...` nor blank
        self.body = b""       # the body of a non-200 answer
        self.error = None     # exception while reading

    def header(self, name):
        return Response(self.status, self.headers, b"").header(name)

    def texts(self, index=0, chat=False):
        out = []
        for ev in self.events:
            for ch in ev.get("choices", []):
                if ch.get("index") != index:
                    continue
                if chat:
                    c = (ch.get("delta") or {}).get("content")
                    if c:
                        out.append(c)
                elif ch.get("text"):
                    out.append(ch["text"])
        return out

    def text(self, index=0, chat=False):
        return "".join(self.texts(index, chat))

    def finish_reason(self, index=0):
        reasons = [ch.get("finish_reason") for ev in self.events for ch in ev.get("choices", [])
                   if ch.get("index") == index and ch.get("finish_reason") is not None]
        return reasons

    def usage(self):
        u = [ev["usage"] for ev in self.events if ev.get("usage")]
        return u[-1] if u else None

    def check_well_formed(self, what=""):
        what = (what + ": ") if what else ""
        check(self.error is None, f"{what}reading the stream failed: {self.error!r}")
        eq(self.status, 200, f"{what}stream status")
        ct = self.header("content-type")
        check(ct.startswith("text/event-stream"), f"{what}stream Content-Type should be text/event-stream, got '{ct}'")
        check(not self.bad_lines, f"{what}lines that are not SSE data: {short(self.bad_lines)}")
        check(self.done, f"{what}stream did not end with 'data: [DONE]' ({len(self.events)} events)")
        check(not self.after_done, f"{what}data after [DONE]: {short(self.after_done)}")
        for ev in self.events:
            check("error" not in ev, f"{what}error event in the stream: {short(ev)}")


def stream(port, path, body, headers=None, timeout=120, on_event=None, conn_out=None):
    """POSTs body and reads the SSE answer. on_event(result, event) is called for
    each parsed event; returning False closes the connection at once (a client
    that goes away). conn_out, a list, receives the connection object."""
    res = StreamResult()
    data, headers = _encode(body, headers)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if conn_out is not None:
        conn_out.append(conn)
    try:
        conn.request("POST", path, body=data, headers=headers)
        r = conn.getresponse()
        res.status = r.status
        res.headers = r.getheaders()
        if r.status != 200:
            res.body = r.read()
            return res
        while True:
            line = r.readline()
            if not line:
                break
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            if not line.startswith(b"data: "):
                res.bad_lines.append(line)
                continue
            payload = line[len(b"data: "):]
            if res.done:
                res.after_done.append(payload)
                continue
            if payload == b"[DONE]":
                res.done = True
                continue
            try:
                ev = json.loads(payload)
            except Exception:  # noqa: BLE001
                res.bad_lines.append(line)
                continue
            res.events.append(ev)
            if on_event is not None and on_event(res, ev) is False:
                abort(conn)
                return res
    except Exception as e:  # noqa: BLE001
        res.error = e
    finally:
        conn.close()
    return res


def abort(conn):
    """Drops a client connection at once (RST where possible), like a client that crashed."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    conn.close()


def raw_exchange(port, data, timeout=10, shut_write=False):
    """Sends raw bytes and reads until the server closes or timeout; returns the bytes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
            if shut_write:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        return read_all(s, timeout)
    finally:
        s.close()


def read_all(s, timeout):
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        if _complete_http_response(out):
            break
    return out


def _complete_http_response(data):
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            try:
                return len(rest) >= int(v.strip())
            except ValueError:
                return False
    return False


def parse_raw_response(data):
    """Parses raw HTTP/1.1 response bytes (Content-Length body) into a Response; None if empty."""
    if not data:
        return None
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    check(len(parts) >= 2 and parts[0].startswith(b"HTTP/1."), f"not an HTTP response: {short(data)}")
    headers = []
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers.append((k.decode().strip(), v.decode().strip()))
    resp = Response(int(parts[1]), headers, rest)
    cl = resp.header("content-length")
    if cl:
        resp.body = rest[: int(cl)]
    return resp


# ---------------------------------------------------------------- metrics

def parse_metrics(text):
    """Prometheus text -> (samples {name: [(labels dict, value)]}, help {name}, type {name: type})."""
    samples, helps, types = {}, {}, {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            helps[name] = line
        elif line.startswith("# TYPE "):
            parts = line.split(" ")
            types[parts[2]] = parts[3] if len(parts) > 3 else ""
        elif line.startswith("#"):
            continue
        else:
            name_labels, _, value = line.rpartition(" ")
            if "{" in name_labels:
                name, _, lbl = name_labels.partition("{")
                lbl = lbl.rstrip("}")
                labels = {}
                for kv in filter(None, lbl.split(",")):
                    k, _, v = kv.partition("=")
                    labels[k] = v.strip('"')
            else:
                name, labels = name_labels, {}
            samples.setdefault(name, []).append((labels, float(value)))
    return samples, helps, types


def metric(port, name, labels=None):
    """Sum of the samples of one metric (optionally filtered by labels); None if absent."""
    r = get(port, "/metrics", timeout=10)
    eq(r.status, 200, "GET /metrics status")
    samples, _, _ = parse_metrics(r.body.decode())
    if name not in samples:
        return None
    return sum(v for lbl, v in samples[name] if not labels or all(lbl.get(k) == x for k, x in labels.items()))


def metrics(port, headers=None):
    r = get(port, "/metrics", timeout=10, headers=headers)
    eq(r.status, 200, "GET /metrics status")
    samples, _, _ = parse_metrics(r.body.decode())
    return {k: sum(v for _, v in vals) for k, vals in samples.items()}


def teacher_forced(port, cases, gap=0.01):
    """llama.cpp's greedy paths teacher-forced through /v1/completions: each step
    one request whose prompt is the golden prompt plus the golden tokens so far
    (as token ids), with logprobs=5 and stop_token_ids = the golden's token (so
    finish_reason "stop" says our greedy token is the golden's, by id). Returns
    (mean |d logprob|, max, values compared, steps whose golden top-2 gap
    exceeds `gap`, of those the steps where our greedy token agrees)."""
    total, n, worst, gap_steps, gap_agree = 0.0, 0, 0.0, 0, 0
    for case in cases:
        forced = case["greedy_tokens"]
        for step, top in enumerate(case["top5_logprobs"]):
            body = {"prompt": case["prompt_tokens"] + forced[:step], "max_tokens": 1, "temperature": 0,
                    "logprobs": 5, "stop_token_ids": [forced[step]]}
            r = post(port, "/v1/completions", body, timeout=60)
            eq(r.status, 200, f"POST /v1/completions {short(body, 200)} ({short(r.body, 300)})")
            ch = r.json()["choices"][0]
            got = sorted(ch["logprobs"]["top_logprobs"][0].values(), reverse=True)
            want = [t["logprob"] for t in top]
            # Fewer than 5 when tokens share a piece (a dict key): then the
            # generated (top-1) token's own log-prob alone.
            top1 = ch["logprobs"]["token_logprobs"][0]
            for a, b in zip(got, want) if len(got) == 5 else [(top1, want[0])]:
                total, n, worst = total + abs(a - b), n + 1, max(worst, abs(a - b))
            if want[0] - want[1] > gap:
                gap_steps += 1
                gap_agree += ch["finish_reason"] == "stop"
    return total / max(n, 1), worst, n, gap_steps, gap_agree


def runner_args(ap):
    """For scripts that run their own servers outside a Suite: adds --serval
    and --shared to ap, parses, points Config at them, kills the servers on
    SIGTERM/SIGINT and line-buffers stdout. Returns the parsed arguments."""
    ap.add_argument("--serval", default=Config.serval)
    ap.add_argument("--shared", default=Config.shared)
    a = ap.parse_args()
    Config.serval = os.path.abspath(a.serval)
    Config.shared = os.path.abspath(a.shared)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    sys.stdout.reconfigure(line_buffering=True)
    return a


def npm_ci(src_dir, files, work):
    """Copies files (package.json and package-lock.json among them) from src_dir
    into work and runs `npm ci` there: dependencies go to a build folder, never
    the source tree. Skipped when that lock file is installed there for this
    Node.js already. Returns the seconds npm ci took (0 when skipped); raises
    AssertionError when node/npm are missing or npm ci fails."""
    node, npm = shutil.which("node"), shutil.which("npm")
    check(node and npm, "node and npm are needed (Debian: apt-get install nodejs npm)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    os.makedirs(work, exist_ok=True)
    for f in files:
        shutil.copyfile(os.path.join(src_dir, f), os.path.join(work, f))
    with open(os.path.join(src_dir, "package-lock.json"), "rb") as f:
        stamp = hashlib.sha256(f.read() + version.encode()).hexdigest()
    stamp_path = os.path.join(work, "node_modules", ".serval-stamp")
    if os.path.exists(stamp_path) and open(stamp_path).read() == stamp:
        return 0.0
    t0 = time.monotonic()
    p = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=work, capture_output=True,
                       text=True, timeout=600)
    check(p.returncode == 0, f"`npm ci` failed with status {p.returncode} in {work}:\n{p.stdout[-4000:]}{p.stderr[-4000:]}")
    with open(stamp_path, "w") as f:
        f.write(stamp)
    return time.monotonic() - t0


def wait_until(fn, timeout, interval=0.02):
    """Polls fn() until it returns a truthy value; returns (value, seconds waited) or (last value, None)."""
    t0 = time.monotonic()
    v = None
    while True:
        v = fn()
        if v:
            return v, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return v, None
        time.sleep(interval)


# ---------------------------------------------------------------- servers

_live = set()
_live_lock = threading.Lock()


def wait_in_engine(port, n, timeout=30):
    """With the engine paused (--engine-control): steps it one step at a time
    until n requests are in it (running or waiting); True when they are."""
    def in_engine():
        post(port, "/v1/engine/step", {"steps": 1})
        s = get(port, "/v1/engine/state").json()["requests"]
        return s["running"] + s["waiting"] == n
    return wait_until(in_engine, timeout)[0] is True


def free_port():
    """A port free now (for a test's own listener that binds it at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `serval serve` process on 127.0.0.1. Use as a context manager."""

    def __init__(self, *args, name="serval", model=None, chat_template=True, threads=1, port=0):
        self.name = name
        self.fixed_port = port  # 0: the server picks a free one
        self.args = list(args)
        self.model = model or Config.model()
        self.chat_template = Config.chat_template() if chat_template is True else chat_template
        self.threads = threads
        self.proc = None
        self.port = None
        self.log_path = None

    def command(self):
        # Port 0: the server binds a free port itself and logs it (no race with another process).
        cmd = [Config.serval, "serve", "-m", self.model, "--host", "127.0.0.1", "--port", str(self.fixed_port),
               "-t", str(self.threads)]
        if "--kv-memory" not in self.args:
            cmd += ["--kv-memory", "64M"]
        if self.chat_template:
            cmd += ["--chat-template", self.chat_template]
        cmd += self.args
        if "--batch-dir" not in self.args and "--no-batch" not in self.args:
            cmd += ["--no-batch"]  # no batch store in the user's data folder; test_batch.py passes its own
        if shutil.which("setpriv"):
            # Killed with the runner, even if the runner is SIGKILLed (CTest timeout).
            cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + cmd
        return cmd

    LISTENING = re.compile(r"serval serve: listening on http://127\.0\.0\.1:(\d+) ")

    def start(self, timeout=60):
        check(os.path.exists(Config.serval), f"serval binary not found at {Config.serval}")
        check(os.path.exists(self.model), f"model not found at {self.model}")
        self.port = None
        fd, self.log_path = tempfile.mkstemp(prefix=f"serval-test-{self.name}-", suffix=".log")
        log = os.fdopen(fd, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        with _live_lock:
            _live.add(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.port is None:
                m = self.LISTENING.search(self.log())
                if m:
                    self.port = int(m.group(1))
            if self.port is not None:
                try:
                    if get(self.port, "/health", timeout=2).status == 200:
                        return self
                except OSError:
                    pass
            time.sleep(0.05)
        log_text = self.log()
        self.kill()
        self.cleanup_log()
        raise AssertionError(f"server '{self.name}' did not come up within {timeout} s (exit {self.proc.returncode}); "
                             f"command: {' '.join(self.command())}\nlog:\n{log_text[-3000:]}")

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout):
        return self.proc.wait(timeout=timeout)

    def stop(self):
        """SIGTERM (drain), a second SIGTERM (stop at once) after 3 s, SIGKILL after 5 s more."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.kill()
        with _live_lock:
            _live.discard(self)
        return self.proc.returncode

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        with _live_lock:
            _live.discard(self)

    def cleanup_log(self):
        if self.log_path and os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        rc = self.stop()
        log = self.log()
        self.cleanup_log()
        report = sanitizer_report(log)
        if report and exc[0] is None:
            raise AssertionError(f"server '{self.name}': sanitizer report in its log:\n{report}")
        # A server that crashed on its way out (SIGTERM drain, shutdown) fails the test that ran it;
        # SIGKILL is the harness's own last resort (or the test's) and says nothing about the server.
        if rc is not None and rc < 0 and rc != -signal.SIGKILL and exc[0] is None:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            raise AssertionError(f"server '{self.name}' died of {name} (exit {rc}); log tail:\n{log[-2000:]}")
        return False


class Gateway(Server):
    """One `serval gateway` process on 127.0.0.1 with the TOML text `config`
    (its [server] port is overridden with a free one). Use as a context manager."""

    LISTENING = re.compile(r"serval gateway: listening on http://127\.0\.0\.1:(\d+) ")

    def __init__(self, config, *args, name="gateway", port=0):
        super().__init__(*args, name=name, chat_template=False, port=port)
        fd, self.config_path = tempfile.mkstemp(prefix="serval-gateway-", suffix=".toml")
        with os.fdopen(fd, "w") as f:
            f.write(config)

    def command(self):
        cmd = [Config.serval, "gateway", "--config", self.config_path, "--host", "127.0.0.1",
               "--port", str(self.fixed_port)] + self.args
        if shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + cmd
        return cmd

    def cleanup_log(self):
        super().cleanup_log()
        if os.path.exists(self.config_path):
            os.unlink(self.config_path)


SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "WARNING: ThreadSanitizer")


def sanitizer_report(log):
    """The first sanitizer report in a server log (ASan, LSan, UBSan), or ''."""
    at = min((i for i in (log.find(m) for m in SANITIZER_MARKERS) if i >= 0), default=-1)
    return log[max(0, at - 200):at + 3000] if at >= 0 else ""


def _print_log_tails(lines=15):
    with _live_lock:
        live = list(_live)
    for s in live:
        tail = s.log().splitlines()[-lines:]
        print(f"  -- log of server '{s.name}' (port {s.port}, last {len(tail)} lines):")
        for line in tail:
            print("  | " + line)


def _kill_all():
    with _live_lock:
        live = list(_live)
    for s in live:
        try:
            s.kill()
        except Exception:  # noqa: BLE001
            pass


atexit.register(_kill_all)


def _on_signal(sig, frame):
    _kill_all()
    sys.stdout.write(f"\ninterrupted by signal {sig}\n")
    sys.stdout.flush()
    os._exit(128 + sig)


# ---------------------------------------------------------------- suite

class Suite:
    def __init__(self, name):
        self.name = name
        self.tests = []
        self.fixture = None

    def test(self, fn):
        self.tests.append(fn)
        return fn

    def setup(self, fn):
        """fn: a @contextlib.contextmanager generator yielding the object passed to each test."""
        self.fixture = fn
        return fn

    def main(self):
        ap = argparse.ArgumentParser(description=f"serval server tests: {self.name}")
        ap.add_argument("--serval", default=Config.serval)
        ap.add_argument("--shared", default=Config.shared)
        ap.add_argument("-k", action="append", default=[], help="run tests whose name contains this")
        ap.add_argument("-v", action="store_true")
        a = ap.parse_args()
        Config.serval = os.path.abspath(a.serval)
        Config.shared = os.path.abspath(a.shared)
        Config.verbose = a.v
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        sys.stdout.reconfigure(line_buffering=True)

        selected = [t for t in self.tests if not a.k or any(k in t.__name__ for k in a.k)]
        if not selected:
            print(f"{self.name}: no test selected (-k {a.k})")
            raise SystemExit(1)
        t_start = time.monotonic()
        print(f"== {self.name}: {len(selected)} tests (serval {Config.serval}, shared {Config.shared})")
        passed = failed = skipped = 0
        failures = []
        ctx_mgr = self.fixture() if self.fixture else contextlib.nullcontext()
        try:
            ctx = ctx_mgr.__enter__()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(file=sys.stdout)
            _kill_all()
            print(f"{self.name}: set-up failed: {e}\n{self.name}: 0 passed, {len(selected)} failed")
            raise SystemExit(1)
        try:
            for t in selected:
                t0 = time.monotonic()
                try:
                    t(ctx)
                    passed += 1
                    print(f"PASS {t.__name__} ({time.monotonic() - t0:.2f} s)")
                except SkipTest as e:
                    skipped += 1
                    print(f"SKIP {t.__name__}: {e}")
                except Exception as e:  # noqa: BLE001
                    failed += 1
                    failures.append(t.__name__)
                    kind = "" if isinstance(e, AssertionError) else f"{type(e).__name__}: "
                    print(f"FAIL {t.__name__} ({time.monotonic() - t0:.2f} s): {kind}{e}")
                    if Config.verbose or not isinstance(e, AssertionError):
                        traceback.print_exc(file=sys.stdout)
                    _print_log_tails()
        finally:
            try:
                ctx_mgr.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                traceback.print_exc(file=sys.stdout)
                failed += 1
            _kill_all()
        if failures:
            print("failed: " + ", ".join(failures))
        extra = f", {skipped} skipped" if skipped else ""
        print(f"{self.name}: {passed} passed, {failed} failed{extra} ({time.monotonic() - t_start:.1f} s)")
        raise SystemExit(1 if failed else 0)


def run_threads(fns, timeout=120):
    """Runs each zero-arg fn in its own thread, started together; returns their results
    (an exception object in place of the result of a fn that raised)."""
    results = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def wrap(i, fn):
        try:
            barrier.wait(timeout=30)
            results[i] = fn()
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    check(all(not t.is_alive() for t in threads), f"{sum(t.is_alive() for t in threads)} client threads still running after {timeout} s")
    return results
