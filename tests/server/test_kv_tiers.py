#!/usr/bin/env python3
"""KV cache tiers through `serval serve` (stories260K, a pool that holds one
prompt): prompts the pool evicted come back from the RAM tier and, after a
pool + RAM eviction, from the disk tier, with text and log-probs identical to
a server without any cache; tier budgets are never exceeded (from /metrics
after every request); a server restarted on the same --kv-cache-dir hits the
disk tier on its first request; SIGKILL in the middle of tier writes leaves
no file that the next start uses wrongly, and damaged files are counted and
never used; saved sessions (/v1/sessions) are pinned against eviction,
restored into the pool, owned by their API key and survive restarts; bad
flags and bad session requests get clear errors."""

import contextlib
import glob
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, eq, get, metric, post, run_threads  # noqa: E402

suite = Suite("server_kv_tiers")
BLOCK_BYTES = 20480  # stories260K, f32 KV: 5 layers x K,V x 16 tokens x 32 x 4 bytes
POOL = ["--kv-type", "f32", "--kv-memory", str(16 * BLOCK_BYTES), "--max-seqs", "4"]
RAM = ["--kv-cache-ram", str(28 * BLOCK_BYTES)]  # two prompts' blocks


def prompts(n, length=200, seed=777):
    out, s = [], seed
    for _ in range(n):
        p = [1]
        while len(p) < length:
            s = (s * 1664525 + 1013904223) % (1 << 32)
            p.append(3 + (s >> 8) % 500)
        out.append(p)
    return out


def complete(port, p):
    r = post(port, "/v1/completions", {"prompt": p, "max_tokens": 12, "temperature": 0, "logprobs": 3,
                                       "ignore_eos": True})
    eq(r.status, 200, f"completion ({r})")
    ch = r.json()["choices"][0]
    return ch["text"], ch["logprobs"]["token_logprobs"], ch["logprobs"]["top_logprobs"]


def tier_metric(port, name, tier):
    return metric(port, name, {"tier": tier}) or 0


def check_budgets(port, what):
    for tier in ("ram", "disk"):
        used = metric(port, "serval_kv_tier_bytes", {"tier": tier})
        cap = metric(port, "serval_kv_tier_capacity_bytes", {"tier": tier})
        check(used is not None and cap is not None, f"{what}: serval_kv_tier_bytes{{tier={tier}}} exported")
        check(used <= cap, f"{what}: tier {tier} holds {used} bytes over its budget {cap}")


REFERENCE = {}


@suite.setup
@contextlib.contextmanager
def setup():
    # Reference outputs: a server with no prefix cache at all.
    with Server(*POOL, "--no-prefix-caching", name="tiers-reference") as ref:
        for i, p in enumerate(prompts(6)):
            REFERENCE[i] = complete(ref.port, p)
    yield None


@suite.test
def evicted_prefixes_come_back_from_ram_then_disk(_):
    tmp = tempfile.mkdtemp(prefix="serval-tiers-")
    try:
        ps = prompts(6)
        with Server(*POOL, *RAM, "--kv-cache-dir", tmp, "--kv-cache-disk", "64M", name="tiers") as srv:
            order = [0, 1, 0, 2, 3, 4, 1, 0]
            for step, i in enumerate(order):
                eq(complete(srv.port, ps[i]), REFERENCE[i], f"request {step} (prompt {i}) equals the uncached server")
                check_budgets(srv.port, f"after request {step}")
                if step == 2:  # prompt 0 again: the pool kept its first blocks, RAM has the rest
                    ram = tier_metric(srv.port, "serval_kv_tier_hits_total", "ram")
                    check(ram >= 8, f"prompt 0 from the RAM tier: {ram} block hits")
                    eq(tier_metric(srv.port, "serval_kv_tier_hits_total", "disk"), 0, "nothing from disk yet")
            ram = tier_metric(srv.port, "serval_kv_tier_hits_total", "ram")
            disk = tier_metric(srv.port, "serval_kv_tier_hits_total", "disk")
            # Prompts 1 and 0 again after three others: out of the pool and out of RAM.
            check(disk >= 20, f"disk tier hits: {disk}")
            hit_tokens = metric(srv.port, "serval_kv_tier_hit_tokens_total")
            eq(hit_tokens, 16 * (ram + disk), "tier hit tokens = 16 per block loaded")
            eq(metric(srv.port, "serval_kv_tier_disk_corrupt_total"), 0, "no damaged files")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@suite.test
def restart_hits_the_disk_tier_on_its_first_request(_):
    tmp = tempfile.mkdtemp(prefix="serval-tiers-")
    try:
        ps = prompts(6)
        args = [*POOL, "--kv-cache-dir", tmp, "--kv-cache-disk", "64M"]
        with Server(*args, name="tiers-before") as srv:
            eq(complete(srv.port, ps[3]), REFERENCE[3], "first server")
        # SIGTERM: the pool's cached blocks are written out at shutdown.
        files = glob.glob(os.path.join(tmp, "*.kvb"))
        check(len(files) >= 12, f"block files after shutdown: {len(files)}")
        with Server(*args, name="tiers-after") as srv:
            eq(metric(srv.port, "serval_kv_tier_disk_recovered_files"), len(files), "files indexed at start")
            eq(complete(srv.port, ps[3]), REFERENCE[3], "first request after the restart")
            eq(tier_metric(srv.port, "serval_kv_tier_hits_total", "disk"), 12, "disk hits of the first request")
            eq(metric(srv.port, "serval_kv_tier_hit_tokens_total"), 192, "its prompt tokens served from disk")
            st = get(srv.port, "/v1/engine/state").json()["kv_tiers"]["disk"]
            eq(st["prefetches"], 12, "the request's disk blocks were read ahead when it arrived")
            eq(st["staged_loads"], 12, "and promoted from memory: none was read on the engine thread")
            eq(st["staged_bytes"], 0, "no staged copy left over")
        # Another KV type on the same directory: every file is foreign.
        with Server(*[a if a != "f32" else "f16" for a in args], name="tiers-f16") as srv:
            check(metric(srv.port, "serval_kv_tier_disk_foreign_files") >= 12, "f32 files are foreign to an f16 KV")
            complete(srv.port, ps[3])
            eq(metric(srv.port, "serval_kv_tier_hit_tokens_total"), 0, "no hits from another KV type's files")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@suite.test
def sigkill_during_writes_and_damaged_files_are_never_used(_):
    tmp = tempfile.mkdtemp(prefix="serval-tiers-")
    try:
        ps = prompts(6)
        args = [*POOL, "--kv-cache-dir", tmp, "--kv-cache-disk", "64M"]  # no RAM tier: every eviction writes a file
        srv = Server(*args, name="tiers-kill")
        srv.start()
        try:
            # Prompts 0, 1, 2 one by one: 1 and then 2 evict all 12 full blocks of 0, which are written first.
            for i in range(3):
                complete(srv.port, ps[i])
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (metric(srv.port, "serval_kv_tier_disk_writes_total") or 0) < 12:
                time.sleep(0.005)
            writes0 = metric(srv.port, "serval_kv_tier_disk_writes_total")

            # Then keep the pool evicting (and the writer writing) from 4 clients, and kill -9 mid-way.
            def client(k):
                for j in range(6):
                    complete(srv.port, ps[(k + j) % 6])
            t = threading.Thread(target=lambda: run_threads([lambda k=k: client(k) for k in range(4)]), daemon=True)
            t.start()
            while time.monotonic() < deadline and metric(srv.port, "serval_kv_tier_disk_writes_total") < writes0 + 12:
                time.sleep(0.002)
            srv.kill()
            t.join(timeout=30)
        finally:
            srv.kill()
        # Damage two files that are not prompt 0's: a truncated one and one with a flipped payload byte.
        first = [ps[0][i * 16:(i + 1) * 16] for i in range(12)]

        def tokens_of(path):
            with open(path, "rb") as f:
                head = f.read(104 + 64)
            return list(struct.unpack("<16i", head[104:104 + 64])) if len(head) == 168 else None
        files = sorted(glob.glob(os.path.join(tmp, "*.kvb")))
        others = [f for f in files if tokens_of(f) not in first]
        check(len(files) - len(others) >= 12, f"prompt 0's 12 blocks are on disk ({len(files) - len(others)})")
        check(len(others) >= 2, f"files of other prompts after the kill: {len(others)}")
        size = os.path.getsize(others[0])
        with open(others[0], "r+b") as f:
            f.truncate(size // 3)
        with open(others[1], "r+b") as f:
            f.seek(size - 100)
            b = f.read(1)
            f.seek(size - 100)
            f.write(bytes([b[0] ^ 0x55]))
        with open(os.path.join(tmp, "0123456789abcdef0123456789abcdef.tmp"), "wb") as f:
            f.write(b"half a block")
        with Server(*args, name="tiers-after-kill") as srv:
            check(not glob.glob(os.path.join(tmp, "*.tmp")), "unfinished writes are deleted at start")
            check(metric(srv.port, "serval_kv_tier_disk_corrupt_total") >= 1, "the truncated file is counted")
            for i in range(6):  # whatever hits, the output is exact
                eq(complete(srv.port, ps[i]), REFERENCE[i], f"prompt {i} after the kill")
                check_budgets(srv.port, f"after prompt {i}")
                if i == 0:
                    check(tier_metric(srv.port, "serval_kv_tier_hits_total", "disk") >= 12,
                          "prompt 0 came from its files")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def call(port, method, path, body=None, key=None):
    from harness import request
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return request(port, method, path, body=body, headers=headers)


def metric_as(port, name, key, labels=None):
    from harness import parse_metrics
    r = call(port, "GET", "/metrics", None, key)
    eq(r.status, 200, "GET /metrics")
    samples, _, _ = parse_metrics(r.body.decode())
    return sum(v for lbl, v in samples.get(name, []) if not labels or all(lbl.get(k) == x for k, x in labels.items()))


def complete_as(port, p, key, max_tokens=12):
    r = call(port, "POST", "/v1/completions", {"prompt": p, "max_tokens": max_tokens, "temperature": 0, "logprobs": 3,
                                               "ignore_eos": True}, key)
    eq(r.status, 200, f"completion ({r})")
    ch = r.json()["choices"][0]
    return (ch["text"], ch["logprobs"]["token_logprobs"], ch["logprobs"]["top_logprobs"]), r.json()["usage"]


@suite.test
def sessions_are_pinned_restored_owned_and_survive_restarts(_):
    tmp = tempfile.mkdtemp(prefix="serval-tiers-")
    try:
        ps = prompts(6)
        k1, k2 = "key-one", "key-two"
        # A disk budget of 30 block files: the other prompts' blocks churn through it, the session's stay.
        args = [*POOL, "--api-key", k1, "--api-key", k2, "--kv-cache-dir", tmp,
                "--kv-cache-disk", str(30 * (BLOCK_BYTES + 104 + 64))]
        with Server(*args, name="sessions") as srv:
            r = call(srv.port, "POST", "/v1/sessions/chat-1/save", {"prompt": ps[0]}, k1)
            eq(r.status, 200, f"save ({r})")
            j = r.json()
            eq((j["id"], j["object"], j["tokens"], j["saved_tokens"]), ("chat-1", "session", 200, 192), "save body")
            for i in range(1, 6):
                complete_as(srv.port, ps[i], k1)
            check(metric_as(srv.port, "serval_kv_tier_evictions_total", k1, {"tier": "disk"}) > 0, "the disk tier evicted")
            r = call(srv.port, "POST", "/v1/sessions/chat-1/restore", None, k1)
            eq(r.status, 200, f"restore ({r})")
            eq(r.json()["restored_tokens"], 192, "restored from the pinned files")
            hits0 = metric_as(srv.port, "serval_kv_tier_hit_tokens_total", k1)
            out, usage = complete_as(srv.port, ps[0], k1)
            eq(out, REFERENCE[0], "the conversation resumes exactly")
            eq(usage["prompt_tokens_details"]["cached_tokens"], 192, "its prefix was in the pool")
            eq(metric_as(srv.port, "serval_kv_tier_hit_tokens_total", k1), hits0, "after a restore no tier load is needed")
            # Another key: the session does not exist for it.
            for method, path in [("GET", "/v1/sessions/chat-1"), ("POST", "/v1/sessions/chat-1/restore"),
                                 ("DELETE", "/v1/sessions/chat-1")]:
                r = call(srv.port, method, path, None, k2)
                eq(r.status, 404, f"{method} {path} with another key ({r})")
            eq(call(srv.port, "GET", "/v1/sessions", None, k2).json()["data"], [], "another key lists none")
            eq([x["id"] for x in call(srv.port, "GET", "/v1/sessions", None, k1).json()["data"]], ["chat-1"],
               "the owner lists it")
            # Bad input.
            eq(call(srv.port, "POST", "/v1/sessions/bad!id/save", {"prompt": ps[1]}, k1).status, 400, "bad id")
            eq(call(srv.port, "POST", "/v1/sessions/x/save", "{not json", k1).status, 400, "bad body")
            eq(call(srv.port, "POST", "/v1/sessions/x/save", {"prompt": [1, 999999]}, k1).status, 400, "bad token id")
            eq(call(srv.port, "GET", "/v1/sessions/x/save", None, k1).status, 405, "GET on save")
            eq(call(srv.port, "POST", "/v1/sessions/chat-1/save", {"prompt": ps[1]}, None).status, 401, "no key")
        # Restart: the session and its pins come back.
        with Server(*args, name="sessions-restarted") as srv:
            r = call(srv.port, "GET", "/v1/sessions/chat-1", None, k1)
            eq((r.status, r.json().get("saved_tokens")), (200, 192), f"the session after a restart ({r})")
            for i in range(1, 6):  # churn the disk tier again
                complete_as(srv.port, ps[(i + 1) % 5 + 1], k1)
            r = call(srv.port, "POST", "/v1/sessions/chat-1/restore", None, k1)
            eq(r.json().get("restored_tokens"), 192, f"restored after a restart and more churn ({r})")
            eq(call(srv.port, "DELETE", "/v1/sessions/chat-1", None, k1).json()["deleted"], True, "deleted")
            eq(call(srv.port, "GET", "/v1/sessions/chat-1", None, k1).status, 404, "gone")
        # No disk tier: sessions are off, with a clear error.
        with Server(*POOL, name="no-sessions") as srv:
            r = call(srv.port, "POST", "/v1/sessions/a/save", {"prompt": ps[0]})
            eq((r.status, r.json()["error"]["code"]), (400, "sessions_disabled"), "without --kv-cache-dir")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@suite.test
def bad_flags_get_one_line_errors(_):
    model = os.path.join(Config.shared, "models", "stories260K.gguf")
    for args, want in [(["--kv-cache-ram", "10"], "holds no KV block"),
                       (["--kv-cache-disk", "1G"], "needs --kv-cache-dir"),
                       (["--kv-cache-dir", "/tmp/x", "--kv-cache-disk", "0.5"], "expected bytes"),
                       (["--kv-cache-ram", "1M", "--no-prefix-caching"], "prefix caching"),
                       (["--kv-cache-dir", "/proc/version/x"], "--kv-cache-dir")]:
        r = subprocess.run([Config.serval, "serve", "-m", model, "--port", "0", *args], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode != 0, f"{args}: exit {r.returncode}")
        check(want in r.stderr, f"{args}: stderr {r.stderr.strip()[:300]!r} lacks {want!r}")


if __name__ == "__main__":
    sys.exit(suite.main())
