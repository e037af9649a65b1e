"""Shared by the bench/ scripts that drive `serval serve`: start it on a free
port (port 0; the port is read from its log) and wait until it listens."""

import re
import subprocess
import tempfile
import time


def start_serve(cmd, log_prefix, timeout=300):
    """Starts `cmd` (a `serval serve ... --port 0` command line); returns
    (process, port, log path) once it logs that it listens."""
    log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = open(log.name, errors="replace").read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m:
            return p, int(m.group(1)), log.name
        if p.poll() is not None:
            raise RuntimeError(f"server exited: {text[-2000:]}")
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("server did not start")
