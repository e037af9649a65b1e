#!/usr/bin/env python3
"""Runs node/openai_sdk_test.mjs, node/anthropic_sdk_test.mjs,
node/embeddings_sdk_test.mjs (the official OpenAI and Anthropic Node SDKs
against `serval serve`) and node/gateway_sdk_test.mjs (the OpenAI SDK through
`serval gateway` in front of those servers): installs the SDKs from node/package-lock.json with
`npm ci` into a work folder (a build folder: nothing is written to the source
tree), starts a server with an API key (stories260K, and a synthetic bert
embedding model written by `serval gguf synth` for the embeddings script) and
runs each script against it.

Skips (prints SKIP, exits 0) only when `node` or `npm` is not installed; a
failing `npm ci` (registry unreachable, bad lock file) is a failure.

  run_node_test.py [--serval PATH] [--shared DIR] [--work DIR]
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import harness  # noqa: E402
from harness import Config, Server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_SRC = os.path.join(HERE, "node")
SCRIPTS = ("openai_sdk_test.mjs", "anthropic_sdk_test.mjs", "embeddings_sdk_test.mjs", "gateway_sdk_test.mjs")
FILES = ("package.json", "package-lock.json", "runner.mjs") + SCRIPTS
NAME = "server_openai_node"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=os.path.join(harness.REPO, "build", "tests", "server", "node"))
    a = harness.runner_args(ap)
    a.work = os.path.abspath(a.work)
    t_start = time.monotonic()

    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        missing = " and ".join(n for n, p in (("node", node), ("npm", npm)) if not p)
        print(f"SKIP {NAME}: {missing} not installed (Debian: apt-get install nodejs npm)")
        print(f"{NAME}: 0 passed, 0 failed, 1 skipped")
        return 0
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"== {NAME}: node {version} ({node}), npm {npm}; work dir {a.work}")

    try:
        took = harness.npm_ci(NODE_SRC, FILES, a.work)
    except AssertionError as e:
        print(f"FAIL {NAME}: {e}")
        print(f"{NAME}: 0 passed, 1 failed")
        return 1
    if took:
        print(f"  npm ci: {took:.1f} s")

    key = "sk-serval-node-test"
    model_id = "stories260K"
    try:
        with tempfile.TemporaryDirectory(prefix="serval-node-batch-") as batch_dir:
            bert = os.path.join(batch_dir, "bert-tiny.gguf")
            subprocess.run([Config.serval, "gguf", "synth", "--shape", "bert-tiny", "--type", "f16", "-t", "1",
                            "--vocab", os.path.join(Config.shared, "tokenizer-vectors", "ggml-vocab-bert-bge.gguf"),
                            "-o", bert], check=True, capture_output=True)
            with Server("--api-key", key, "--served-model-name", model_id, "--batch-dir", batch_dir,
                        name="node") as srv, \
                    Server("--api-key", key, "--served-model-name", "bert-tiny", name="node-embed", model=bert,
                           chat_template=False) as emb, \
                    harness.Gateway(gateway_config(srv, emb, key, model_id), name="node-gateway") as gw:
                rc = run_scripts(node, a.work, srv, emb, gw, key, model_id)
    except AssertionError as e:
        print(f"FAIL {NAME}: {e}")
        print(f"{NAME}: 0 passed, 1 failed")
        return 1
    print(f"  ({time.monotonic() - t_start:.1f} s)")
    return 0 if rc == 0 else 1


GATEWAY_KEY = "sk-gateway-sdk-key-0001"
GATEWAY_ADMIN = "sk-gateway-admin-key-0001"


def gateway_config(srv, emb, key, model_id):
    """`serval gateway` in front of both servers, with a budget-limited virtual
    key for gateway_sdk_test.mjs (0.001 per completion token, 2.0 a day)."""
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    return f"""
[auth]
admin_key_sha256 = "{sha(GATEWAY_ADMIN)}"
require_key = true
[[models]]
name = "{model_id}"
upstreams = ["http://127.0.0.1:{srv.port}"]
api_key = "{key}"
price_output_per_mtok = 1000
[[models]]
name = "restricted"
upstreams = ["http://127.0.0.1:{srv.port}"]
upstream_model = "{model_id}"
api_key = "{key}"
[[models]]
name = "bert-tiny"
upstreams = ["http://127.0.0.1:{emb.port}"]
api_key = "{key}"
[[keys]]
name = "sdk"
sha256 = "{sha(GATEWAY_KEY)}"
models = ["{model_id}", "bert-tiny"]
budget = 2.0
budget_period = "day"
"""


def run_scripts(node, work, srv, emb, gw, key, model_id):
    """Each script against the servers; 0 when all pass."""
    env = dict(os.environ, SERVAL_BASE_URL=f"http://127.0.0.1:{srv.port}/v1", SERVAL_API_KEY=key,
               SERVAL_GATEWAY_URL=f"http://127.0.0.1:{gw.port}/v1", SERVAL_GATEWAY_KEY=GATEWAY_KEY,
               SERVAL_GATEWAY_ADMIN=GATEWAY_ADMIN,
               SERVAL_MODEL_ID=model_id, SERVAL_EMBED_BASE_URL=f"http://127.0.0.1:{emb.port}/v1",
               SERVAL_EMBED_MODEL_ID="bert-tiny",
               SERVAL_GOLDEN=os.path.join(Config.shared, "golden", "stories260K-greedy.json"))
    env.pop("OPENAI_BASE_URL", None)
    env.pop("OPENAI_API_KEY", None)
    rc = 0
    for script in SCRIPTS:
        p = subprocess.run([node, os.path.join(work, script)], cwd=work, env=env, timeout=240)
        rc = rc or p.returncode
    if rc != 0:
        harness._print_log_tails()
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
