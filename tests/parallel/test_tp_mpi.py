#!/usr/bin/env python3
"""Tensor parallelism across processes (parallel/mpi_link.h), on loopback:
`mpirun --oversubscribe -np N serval run|serve|bench model --tp N` against one process.

- Greedy output of `serval run` is the same text, byte for byte, split 2 and 4
  ways (stories260K, mini-llama Q4_0, mini-qwen2 Q8_0).
- Teacher-forced prompt log-probs from `serve --tp N` (/v1/completions, echo +
  logprobs, with the default F16 KV) equal one process's exactly, top
  candidates included, on stories260K and the quantized mini files (Q4_0,
  Q8_0, Q4_K_M): the shards compute the whole model's arithmetic
  (model/tensor_parallel.h).
- Bad input: a split the model cannot take, --tp without mpirun, --tp with KV
  tiers: one line, non-zero exit.
- A rank killed with SIGKILL under load ends the job with a clear error, never
  a hang.

Needs mpirun (Debian: openmpi-bin); CI runs as root, hence
--allow-run-as-root. Label `mpi`: the sanitize stage leaves it to the release
stage (Open MPI's own allocations would read as leaks)."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Suite, check, eq, get, post  # noqa: E402

suite = Suite("parallel_mpi")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
PROMPT = "Once upon a time"


def model(name):
    return os.path.join(Config.shared, "models", name)


def run(args, n=None, timeout=120):
    cmd = ([*MPIRUN, "-np", str(n)] if n else []) + [Config.serval, "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@suite.setup
@contextlib.contextmanager
def setup():
    check(shutil.which("mpirun"), "mpirun not installed (Debian: openmpi-bin; scripts/install-deps.sh installs it)")
    yield {}


@suite.test
def greedy_run_is_the_same_text(ctx):
    for name, splits in (("stories260K.gguf", (2, 4)), ("mini/mini-llama-Q4_0.gguf", (2, 4)),
                         ("mini/mini-qwen2-Q8_0.gguf", (2,))):
        args = ["-m", model(name), "-p", PROMPT, "-n", "48", "--temp", "0", "-t", "1"]
        one = run(args)
        eq(one.returncode, 0, f"{name}: one process ({one.stderr[-500:]})")
        for n in splits:
            tp = run(args + ["--tp", str(n)], n=n)
            eq(tp.returncode, 0, f"{name}: --tp {n} ({tp.stderr[-1500:]})")
            eq(tp.stdout, one.stdout, f"{name}: --tp {n} text")
            # Rank 0's KV pool holds its share of the heads.
            kv_one = re.search(r"(\d+) bytes/token", one.stderr)
            kv_tp = re.search(r"(\d+) bytes/token", tp.stderr)
            check(kv_one and kv_tp and int(kv_tp.group(1)) * n == int(kv_one.group(1)),
                  f"{name}: KV bytes per token split {n} ways ({kv_one and kv_one.group(0)}, {kv_tp and kv_tp.group(0)})")


@suite.test
def bench_model_runs_split(ctx):
    p = subprocess.run([*MPIRUN, "-np", "2", Config.serval, "bench", "model", "-m", model("stories260K.gguf"),
                        "-p", "32", "-n", "16", "-r", "2", "-t", "1", "-o", "json", "--tp", "2"],
                       capture_output=True, text=True, timeout=120)
    eq(p.returncode, 0, f"bench model --tp 2 ({p.stderr[-1000:]})")
    rows = json.loads(p.stdout)
    eq([(r["n_prompt"], r["n_gen"], r["n_tp"]) for r in rows], [(32, 0, 2), (0, 16, 2)], "tests run split 2 ways")
    check(all(r["avg_ts"] > 0 and len(r["samples_ts"]) == 2 for r in rows), f"figures: {rows}")


class Serve:
    """`serval serve` on a free port, alone or under mpirun."""

    def __init__(self, *args, n=None, name="stories260K.gguf"):
        self.cmd = ([*MPIRUN, "-np", str(n)] if n else []) + [
            Config.serval, "serve", "-m", model(name), "--host", "127.0.0.1", "--port", "0", "-t", "1",
            "--kv-memory", "16M", "--no-batch", *args]
        self.log = tempfile.NamedTemporaryFile(prefix="serval-tp-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        self.port = None
        while self.port is None and time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+) ", self.text())
            self.port = int(m.group(1)) if m else None
            time.sleep(0.05)
        check(self.port, f"serve did not start: {' '.join(self.cmd)}\n{self.text()[-2000:]}")

    def text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        os.unlink(self.log.name)


def prompt_logprobs(port, text):
    r = post(port, "/v1/completions", {"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 3,
                                       "temperature": 0})
    eq(r.status, 200, f"prompt logprobs ({r.body[:300]!r})")
    return r.json()["choices"][0]["logprobs"]


@suite.test
def serve_teacher_forced_logprobs_match(ctx):
    text = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
            "One day, she saw a big red ball under a tree and ran to get it.")
    for name, n in (("stories260K.gguf", 2), ("stories260K.gguf", 4), ("mini/mini-llama-Q4_0.gguf", 2),
                    ("mini/mini-qwen2-Q8_0.gguf", 2), ("mini/mini-llama-Q4_K_M.gguf", 4)):
        one = Serve(name=name)
        try:
            want = prompt_logprobs(one.port, text)
            a = post(one.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 32, "temperature": 0}).json()
        finally:
            one.stop()
        tp = Serve("--tp", str(n), name=name, n=n)
        try:
            got = prompt_logprobs(tp.port, text)
            b = post(tp.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 32, "temperature": 0}).json()
            st = get(tp.port, "/v1/engine/state").json()
        finally:
            tp.stop()
        what = f"{name} split {n} ways"
        eq(got["tokens"], want["tokens"], f"{what}: tokens")
        check(len(want["token_logprobs"]) > 20, f"a long enough prompt ({len(want['token_logprobs'])} positions)")
        diffs = [abs(x - y) for x, y in zip(want["token_logprobs"][1:], got["token_logprobs"][1:])]
        eq(got["token_logprobs"], want["token_logprobs"], f"{what}: prompt log-probs (largest |d| {max(diffs):.3g})")
        eq(got["top_logprobs"], want["top_logprobs"], f"{what}: top log-probs")
        eq(b["choices"][0]["text"], a["choices"][0]["text"], f"{what}: greedy text through the server")
        if name == "stories260K.gguf":
            eq(st["kv_cache"]["bytes_per_token"] * n, 640, f"{what}: rank 0 holds 1/{n} of the KV heads (F16)")


@suite.test
def bad_splits_exit_with_one_line(ctx):
    args = ["-m", model("stories260K.gguf"), "-p", PROMPT, "-n", "4", "-t", "1"]
    r = run(args + ["--tp", "3"], n=3)
    check(r.returncode != 0 and "attention.head_count (8) is not a multiple of the tensor-parallel size 3" in r.stderr,
          f"--tp 3: {r.returncode} {r.stderr[-800:]}")
    r = run(args + ["--tp", "2"])
    check(r.returncode == 2 and "--tp 2 needs as many MPI ranks, this run has 1" in r.stderr,
          f"--tp without mpirun: {r.returncode} {r.stderr[-800:]}")
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([*MPIRUN, "-np", "2", Config.serval, "serve", "-m", model("stories260K.gguf"), "--port", "0",
                            "--tp", "2", "--kv-cache-dir", d, "--no-batch"], capture_output=True, text=True, timeout=120)
    check(p.returncode != 0 and "KV tiers are not mirrored" in p.stderr + p.stdout,
          f"--tp with tiers: {p.returncode} {(p.stderr + p.stdout)[-800:]}")


def rank_pids(root):
    """{rank: pid} of the serval processes under an mpirun (OMPI_COMM_WORLD_RANK in their environment)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"serval" in cmd and b"OMPI_COMM_WORLD_RANK" in env and os.getsid(int(pid)) == os.getsid(root):
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
    return out


@suite.test
def a_killed_rank_ends_the_job_with_a_clear_error(ctx):
    tp = Serve("--tp", "2", "--tp-timeout", "5", n=2)
    try:
        pids = rank_pids(tp.proc.pid)
        eq(sorted(pids), [0, 1], f"two ranks ({pids})")
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        try:  # a request after the loss fails (or finds the server gone); it never hangs
            r = post(tp.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 64, "temperature": 0}, timeout=30)
            check(r.status >= 500, f"a request after rank 1 died: {r.status} {r.body[:300]!r}")
        except OSError:
            pass
        rc = tp.proc.wait(60)
        took = time.monotonic() - t0
        text = tp.text()
        check(rc != 0, f"the job's exit status after a rank died: {rc}")
        check(took < 45, f"the job took {took:.1f} s to end")
        check(re.search(r"rank 1 .*(signal 9|Killed)|waited \d+ s for the other ranks", text, re.S),
              f"a clear error names the rank:\n{text[-2000:]}")
    finally:
        tp.stop()


if __name__ == "__main__":
    suite.main()
