#!/usr/bin/env python3
"""Runs browser_test.mjs: the web UI of `serval serve` in headless Chromium
(Debian's `chromium`), driven by puppeteer-core (web/package-lock.json,
installed into web/node_modules by the build). Starts two servers of
stories260K with a chat template and --engine-control (one with an API key)
and a third with --no-webui; the script drives the pages and checks the
servers' state over HTTP. Screenshots go to --out.

Fails (never skips) when Chromium, node or the UI's node_modules are missing:
scripts/install-deps.sh installs Chromium for the test suite.

  run_browser_test.py [--serval PATH] [--shared DIR] [--out DIR] [--chromium PATH]
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import harness  # noqa: E402
from harness import Server  # noqa: E402

NAME = "webui_browser"
WEB = os.path.normpath(os.path.join(HERE, "..", "..", "web"))


def fail(msg):
    print(f"FAIL {NAME}: {msg}")
    print(f"{NAME}: 0 passed, 1 failed")
    return 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(harness.REPO, "build", "tests", "webui"))
    ap.add_argument("--chromium", default=os.environ.get("SERVAL_CHROMIUM", "/usr/bin/chromium"))
    a = harness.runner_args(ap)
    t_start = time.monotonic()

    node = shutil.which("node")
    if not node:
        return fail("node is not installed (scripts/install-deps.sh installs it)")
    if not os.access(a.chromium, os.X_OK):
        return fail(f"Chromium not found at {a.chromium} (scripts/install-deps.sh installs Debian's chromium "
                    "for the tests; SERVAL_CHROMIUM names another)")
    if not os.path.isdir(os.path.join(WEB, "node_modules", "puppeteer-core")):
        return fail(f"puppeteer-core is not installed in {WEB}/node_modules (the build runs `npm ci` there)")
    os.makedirs(a.out, exist_ok=True)

    key = "sk-serval-webui-test"
    try:
        with Server("--engine-control", "--served-model-name", "stories260K", "--reasoning-format", "deepseek",
                    name="webui") as srv, \
                Server("--api-key", key, name="webui-key") as keyed, \
                Server("--no-webui", name="webui-off") as off:
            env = dict(os.environ, SERVAL_URL=f"http://127.0.0.1:{srv.port}",
                       SERVAL_KEY_URL=f"http://127.0.0.1:{keyed.port}", SERVAL_API_KEY=key,
                       SERVAL_OFF_URL=f"http://127.0.0.1:{off.port}", SERVAL_CHROMIUM=a.chromium,
                       SERVAL_WEB_DIR=WEB, SERVAL_OUT=a.out)
            p = subprocess.run([node, os.path.join(HERE, "browser_test.mjs")], cwd=HERE, env=env, timeout=300)
            if p.returncode != 0:
                harness._print_log_tails()
            rc = p.returncode
    except AssertionError as e:
        return fail(str(e))
    print(f"  screenshots in {a.out} ({time.monotonic() - t_start:.1f} s)")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
