#!/usr/bin/env python3
"""The Files and Batches APIs and `serval batch` (docs/BATCH.md), end to end:
a batch survives two SIGKILLs of the server with every custom_id exactly once
and bodies equal to the same requests sent one by one (temperature 0);
malformed lines go to the error file with their line numbers; API keys see
only their own files and batches (404); bad uploads and batch requests get a
4xx naming the field; `serval batch` killed mid-run resumes from its state."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, check_error_body, eq, get, post, request  # noqa: E402

suite = Suite("server_batch")
WORDS = ["cat", "dog", "bird", "fish", "tree", "ball", "sun", "moon", "park", "boat"]


def prompt_of(i):
    return f"Once upon a time, a {WORDS[i % 10]} and a {WORDS[(i // 10) % 10]} went to the {WORDS[(i // 3) % 10]}"


def completion_line(i, max_tokens=48):
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
            "body": {"prompt": prompt_of(i), "max_tokens": max_tokens, "temperature": 0}}


def jsonl(rows):
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def upload(port, content, key=None, purpose="batch", filename="input.jsonl", fields=None):
    boundary = "----serval" + uuid.uuid4().hex
    parts = []
    for name, value in (fields if fields is not None else [("purpose", purpose)]):
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    if content is not None:
        data = content.encode() if isinstance(content, str) else content
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                     f'Content-Type: application/jsonl\r\n\r\n'.encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return request(port, "POST", "/v1/files", body=body, headers=headers)


def auth(key):
    return {"Authorization": f"Bearer {key}"} if key else {}


def create_batch(port, file_id, key=None, endpoint="/v1/completions", **extra):
    body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h", **extra}
    return post(port, "/v1/batches", body, headers=auth(key))


def batch_state(port, batch_id, key=None):
    r = get(port, f"/v1/batches/{batch_id}", headers=auth(key))
    eq(r.status, 200, f"GET /v1/batches/{batch_id}: {r}")
    return r.json()


def wait_batch(port, batch_id, until, timeout=180, key=None):
    deadline = time.monotonic() + timeout
    while True:
        b = batch_state(port, batch_id, key)
        if until(b):
            return b
        check(time.monotonic() < deadline, f"batch {batch_id} did not get there within {timeout} s: {b}")
        time.sleep(0.02)


def file_lines(port, file_id, key=None):
    r = get(port, f"/v1/files/{file_id}/content", headers=auth(key))
    eq(r.status, 200, f"content of {file_id}")
    return [json.loads(x) for x in r.body.decode().split("\n") if x.strip()]


def comparable(body):
    """A response body without what differs between two runs of one request (id, created)."""
    return {"object": body["object"], "model": body["model"],
            "choices": [{"index": c["index"], "finish_reason": c["finish_reason"],
                         "text": c["message"]["content"] if "message" in c else c["text"]} for c in body["choices"]],
            "usage": {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}


@suite.test
def survives_two_sigkills_exactly_once(_):
    n = 200
    rows = [completion_line(i) for i in range(n)]
    # Deliberately malformed lines, interleaved (their line numbers are checked).
    bad = {50: "this is not json", 120: json.dumps({"custom_id": "req-3", "method": "POST", "url": "/v1/completions",
                                                     "body": {"prompt": "dup"}}),
           201: json.dumps({"custom_id": "no-body", "method": "POST", "url": "/v1/completions"})}
    for at in sorted(bad):
        rows.insert(at - 1, bad[at])
    content = jsonl(rows)
    with tempfile.TemporaryDirectory(prefix="serval-batch-") as d:
        args = ("--batch-dir", d, "--batch-concurrency", "2")
        kills = []
        with Server(*args, name="batch-1") as srv:
            r = upload(srv.port, content)
            eq(r.status, 200, f"upload: {r}")
            f = r.json()
            eq((f["object"], f["purpose"], f["bytes"], f["filename"]), ("file", "batch", len(content.encode()), "input.jsonl"),
               "the file object")
            r = create_batch(srv.port, f["id"], metadata={"job": "sigkill-test"})
            eq(r.status, 200, f"create batch: {r}")
            batch = r.json()
            eq((batch["object"], batch["status"], batch["metadata"]), ("batch", "validating", {"job": "sigkill-test"}),
               "the new batch")
            b = wait_batch(srv.port, batch["id"], lambda b: b["request_counts"]["completed"] >= 40)
            srv.kill()  # SIGKILL
            kills.append(b["request_counts"]["completed"])
        with Server(*args, name="batch-2") as srv:
            b = batch_state(srv.port, batch["id"])
            eq(b["status"], "in_progress", "after the first SIGKILL")
            check(b["request_counts"]["completed"] >= kills[0], f"committed lines were lost: {b} after {kills}")
            b = wait_batch(srv.port, batch["id"], lambda b: b["request_counts"]["completed"] >= 120)
            srv.kill()
            kills.append(b["request_counts"]["completed"])
        check(kills[1] < n, f"the second kill came after the batch finished ({kills}); the test needs it mid-run")
        with Server(*args, name="batch-3") as srv:
            b = wait_batch(srv.port, batch["id"], lambda b: b["status"] in ("completed", "failed"))
            eq(b["status"], "completed", f"final status: {b}")
            eq(b["request_counts"], {"total": n + len(bad), "completed": n, "failed": len(bad)}, "request_counts")
            for k in ("created_at", "in_progress_at", "finalizing_at", "completed_at"):
                check(isinstance(b[k], int) and b[k] > 0, f"{k} is set: {b}")
            out = file_lines(srv.port, b["output_file_id"])
            ids = [o["custom_id"] for o in out]
            eq(sorted(ids), sorted(f"req-{i}" for i in range(n)), "every custom_id exactly once in the output")
            errs = file_lines(srv.port, b["error_file_id"])
            eq(sorted(e["error"]["line"] for e in errs), sorted(bad), "the malformed lines' numbers in the error file")
            codes = {e["error"]["line"]: e["error"]["code"] for e in errs}
            eq(codes, {50: "invalid_json_line", 120: "duplicate_custom_id", 201: "invalid_request"}, "error codes")
            # The same requests one by one: equal bodies.
            by_id = {o["custom_id"]: o for o in out}
            sent = rows_by_id(rows)
            for i in range(n):
                o = by_id[f"req-{i}"]
                eq(o["response"]["status_code"], 200, f"req-{i} status")
                check(o["error"] is None, f"req-{i} has no error")
                r = post(srv.port, "/v1/completions", sent[f"req-{i}"]["body"])
                eq(r.status, 200, f"req-{i} one by one")
                eq(comparable(o["response"]["body"]), comparable(r.json()), f"req-{i}: batch body vs one by one")
            # The output file is listed among the owner's files, and it can be deleted.
            listed = get(srv.port, "/v1/files?purpose=batch_output").json()
            check(b["output_file_id"] in [x["id"] for x in listed["data"]], f"output file listed: {listed}")
            r = request(srv.port, "DELETE", f"/v1/files/{b['output_file_id']}")
            eq((r.status, r.json().get("deleted")), (200, True), "delete the output file")
            eq(get(srv.port, f"/v1/files/{b['output_file_id']}").status, 404, "the deleted file is gone")


def rows_by_id(rows):
    return {r["custom_id"]: r for r in rows if isinstance(r, dict)}


@suite.test
def keys_see_only_their_own(_):
    ka, kb = "key-alice", "key-bob"
    with tempfile.TemporaryDirectory(prefix="serval-batch-") as d:
        with Server("--api-key", ka, "--api-key", kb, "--batch-dir", d, name="batch-keys") as srv:
            r = upload(srv.port, jsonl([completion_line(i, 4) for i in range(3)]), key=ka)
            eq(r.status, 200, f"upload: {r}")
            fid = r.json()["id"]
            eq(upload(srv.port, "x", key=None).status, 401, "upload without a key")
            for method, path in (("GET", f"/v1/files/{fid}"), ("GET", f"/v1/files/{fid}/content"),
                                 ("DELETE", f"/v1/files/{fid}")):
                r = request(srv.port, method, path, headers=auth(kb))
                check_error_body(r, 404, f"{method} {path} as another key")
            eq(get(srv.port, "/v1/files", headers=auth(kb)).json()["data"], [], "another key's file list")
            r = create_batch(srv.port, fid, key=kb)
            check_error_body(r, 404, "a batch over another key's file", param="input_file_id")
            r = create_batch(srv.port, fid, key=ka)
            eq(r.status, 200, f"create batch: {r}")
            bid = r.json()["id"]
            check_error_body(get(srv.port, f"/v1/batches/{bid}", headers=auth(kb)), 404, "another key's batch")
            check_error_body(post(srv.port, f"/v1/batches/{bid}/cancel", {}, headers=auth(kb)), 404,
                             "cancelling another key's batch")
            eq(get(srv.port, "/v1/batches", headers=auth(kb)).json()["data"], [], "another key's batch list")
            b = wait_batch(srv.port, bid, lambda b: b["status"] == "completed", key=ka)
            eq(len(file_lines(srv.port, b["output_file_id"], key=ka)), 3, "the owner reads its output")
            check_error_body(get(srv.port, f"/v1/files/{b['output_file_id']}/content", headers=auth(kb)), 404,
                             "another key reading the output")
            lst = get(srv.port, "/v1/batches?limit=1", headers=auth(ka)).json()
            eq((lst["object"], [x["id"] for x in lst["data"]], lst["has_more"]), ("list", [bid], False), "the owner's list")


@suite.test
def bad_requests_name_the_field(_):
    with tempfile.TemporaryDirectory(prefix="serval-batch-") as d:
        with Server("--batch-dir", d, "--batch-max-lines", "5", "--batch-max-line-bytes", "32768",
                    "--max-body-bytes", "65536", name="batch-bad") as srv:
            p = srv.port
            check_error_body(upload(p, "x", fields=[]), 400, "no purpose", param="purpose")
            check_error_body(upload(p, "x", purpose="fine-tune"), 400, "wrong purpose", param="purpose")
            check_error_body(upload(p, None), 400, "no file part", param="file")
            check_error_body(upload(p, ""), 400, "empty file", param="file")
            check_error_body(upload(p, "x", filename="a\x01b"), 400, "control character in the filename", param="file")
            check_error_body(post(p, "/v1/files", {"purpose": "batch"}), 400, "JSON instead of multipart")
            eq(upload(p, "x" * 70000).status, 413, "a file over --max-body-bytes")
            fid = upload(p, jsonl([completion_line(i, 4) for i in range(3)])).json()["id"]
            check_error_body(post(p, "/v1/batches", {"endpoint": "/v1/completions", "completion_window": "24h"}), 400,
                             "no input_file_id", param="input_file_id")
            check_error_body(create_batch(p, fid, endpoint="/v1/embeddings"), 400, "an unsupported endpoint",
                             param="endpoint")
            check_error_body(create_batch(p, fid, completion_window="2d"), 400, "a bad window", param="completion_window")
            check_error_body(create_batch(p, fid, metadata={"k": 1}), 400, "non-string metadata", param="metadata")
            check_error_body(create_batch(p, "file-nope"), 404, "an unknown file", param="input_file_id")
            check_error_body(post(p, "/v1/batches", "{not json"), 400, "a body that is not JSON")
            check_error_body(get(p, "/v1/batches?limit=0"), 400, "limit 0", param="limit")
            check_error_body(get(p, "/v1/batches/batch_nope"), 404, "an unknown batch")
            eq(request(p, "PUT", "/v1/batches").status, 405, "PUT /v1/batches")
            # Too many lines, or a line too long: 400 at upload, naming the limit.
            r = upload(p, jsonl([completion_line(i, 4) for i in range(6)]))
            check_error_body(r, 400, "a 6-line file over --batch-max-lines 5", param="file", code="too_many_lines")
            check("more than 5 lines" in r.json()["error"]["message"], f"the reason: {r}")
            r = upload(p, jsonl([completion_line(0, 4), "x" * 40000]))
            check_error_body(r, 400, "a line over 32 KiB", param="file", code="line_too_long")
            check("line 2" in r.json()["error"]["message"], f"the line is named: {r}")
            # A file that became unusable as a whole (here: emptied behind the server's back) fails the batch.
            gone = upload(p, jsonl([completion_line(0, 4)])).json()["id"]
            open(os.path.join(d, "files", gone), "w").close()
            b = wait_batch(p, create_batch(p, gone).json()["id"], lambda b: b["status"] in ("failed", "completed"))
            eq(b["status"], "failed", f"a batch over an empty file: {b}")
            eq(b["errors"]["data"][0]["code"], "invalid_file", f"the reason: {b['errors']}")
            # Lines a request parser refuses are failed lines, not a failed batch.
            rows = [completion_line(0, 4), {"custom_id": "neg", "method": "POST", "url": "/v1/completions",
                                            "body": {"prompt": "x", "max_tokens": -1}}]
            bid = create_batch(p, upload(p, jsonl(rows)).json()["id"]).json()["id"]
            b = wait_batch(p, bid, lambda b: b["status"] == "completed")
            eq(b["request_counts"], {"total": 2, "completed": 1, "failed": 1}, "one good line, one refused")
            err = file_lines(p, b["error_file_id"])[0]
            eq((err["custom_id"], err["response"]["status_code"]), ("neg", 400), "the refused line's record")
            check("max_tokens" in err["error"]["message"], f"the error names the field: {err}")
            # Cancelling: the batch ends as cancelled with what finished kept; a finished batch cannot be cancelled.
            many = upload(p, jsonl([completion_line(i, 400) for i in range(5)])).json()["id"]
            bid = create_batch(p, many).json()["id"]
            r = post(p, f"/v1/batches/{bid}/cancel", {})
            eq(r.status, 200, f"cancel: {r}")
            check(r.json()["status"] in ("cancelling", "cancelled"), f"status after cancel: {r.json()}")
            b = wait_batch(p, bid, lambda b: b["status"] == "cancelled")
            check(b["request_counts"]["completed"] < 5, f"a cancelled batch stops early: {b}")
            r = post(p, f"/v1/batches/{bid}/cancel", {})
            eq((r.status, r.json()["status"]), (200, "cancelled"), "cancelling a cancelled batch again")
            done = create_batch(p, fid).json()["id"]
            wait_batch(p, done, lambda b: b["status"] == "completed")
            check_error_body(post(p, f"/v1/batches/{done}/cancel", {}), 409, "cancelling a completed batch")


def run_cli(args, timeout=300):
    return subprocess.run([Config.serval, "batch", "-m", Config.model(), "-t", "1", "--kv-memory", "64M"] + args,
                          capture_output=True, text=True, timeout=timeout)


@suite.test
def cli_resumes_after_sigkill(_):
    with tempfile.TemporaryDirectory(prefix="serval-batch-cli-") as d:
        rows = [completion_line(i, 64) for i in range(100)]
        rows.insert(10, {"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}})
        rows.insert(20, "{broken")
        inp = os.path.join(d, "in.jsonl")
        with open(inp, "w") as f:
            f.write(jsonl(rows))
        out, state = os.path.join(d, "out.jsonl"), os.path.join(d, "out.jsonl.state")
        tmpl = ["--chat-template", Config.chat_template(), "--concurrency", "2"]
        cmd = [Config.serval, "batch", "-m", Config.model(), "-t", "1", "--kv-memory", "64M", inp, out] + tmpl
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        done_at_kill = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=1) as db:
                    done_at_kill = db.execute("SELECT COUNT(*) FROM lines WHERE ok = 1").fetchone()[0]
            except sqlite3.Error:
                done_at_kill = 0
            if done_at_kill >= 15:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        proc.wait(timeout=30)
        eq(proc.returncode, -signal.SIGKILL, f"killed mid-run ({done_at_kill} lines done)")
        check(not os.path.exists(out), "no output file before the run finished")
        p = run_cli([inp, out] + tmpl)
        eq(p.returncode, 1, f"exit status with a malformed line: {p.stderr}")
        check("resuming" in p.stderr, f"the rerun resumed: {p.stderr}")
        got = [json.loads(x) for x in open(out)]
        eq(sorted(o["custom_id"] for o in got), sorted(r["custom_id"] for r in rows if isinstance(r, dict)),
           "every custom_id exactly once")
        errs = [json.loads(x) for x in open(os.path.join(d, "out.errors.jsonl"))]
        eq([(e["error"]["line"], e["error"]["code"]) for e in errs], [(21, "invalid_json_line")], "the error file")
        # An uninterrupted run of the same file gives the same bodies.
        out2 = os.path.join(d, "fresh.jsonl")
        p2 = run_cli([inp, out2] + tmpl)
        eq(p2.returncode, 1, p2.stderr)
        fresh = {o["custom_id"]: comparable(o["response"]["body"]) for o in map(json.loads, open(out2))}
        for o in got:
            eq(comparable(o["response"]["body"]), fresh[o["custom_id"]], f"{o['custom_id']}: resumed vs fresh")
        eq(got[10]["response"]["body"]["object"], "chat.completion", "the chat line ran as chat")
        # A state file for another input is refused; --restart starts over.
        other = os.path.join(d, "other.jsonl")
        with open(other, "w") as f:
            f.write(jsonl([completion_line(0, 4)]))
        p3 = run_cli([other, out])
        eq(p3.returncode, 2, f"another input with the same state: {p3.stderr}")
        check("--restart" in p3.stderr, f"the message says how to start over: {p3.stderr}")
        p4 = run_cli([other, out, "--restart"])
        eq(p4.returncode, 0, p4.stderr)
        eq(len(open(out).readlines()), 1, "the restarted run's output")
        check(not os.path.exists(os.path.join(d, "out.errors.jsonl")), "no error file when nothing failed")
        p5 = run_cli([os.path.join(d, "missing.jsonl"), out])
        eq(p5.returncode, 2, "a missing input")


if __name__ == "__main__":
    suite.main()
