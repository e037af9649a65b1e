#!/usr/bin/env python3
"""`serval plan --validate` against a live server: the replay completes every
request at the modelled arrival times, reads the engine's step count and busy
time from /metrics, and salts its prompts so that a second replay finds none
of the first one's prompts in the prefix cache."""

import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, eq, metric  # noqa: E402

suite = Suite("server_plan")
N = 30
RATE = 40.0


def serval(*args, timeout=120):
    r = subprocess.run([Config.serval, *args], capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


@suite.test
def validate_replays_the_workload(_):
    with tempfile.TemporaryDirectory() as d:
        profile = os.path.join(d, "profile.json")
        rc, _, err = serval("plan", "profile", "-m", Config.model(), "-t", "1", "--max-batch", "8", "--max-chunk", "64",
                            "--max-depth", "256", "-r", "1", "--no-roofline", "-o", profile)
        eq(rc, 0, f"plan profile (stderr: {err.strip()})")
        with Server(name="plan") as srv:
            def replay():
                rc, out, err = serval("plan", "-p", profile, "--rate", str(RATE), "--prompt-len", "24", "--gen-len",
                                      "12", "--requests", str(N), "--kv-memory", "64M", "--validate", "--url",
                                      f"http://127.0.0.1:{srv.port}", "-o", "json")
                eq(rc, 0, f"plan --validate (stderr: {err.strip()[-400:]})")
                return json.loads(out)["validation"]

            steps0 = metric(srv.port, "serval_engine_steps_total")
            v = replay()
            m, p = v["measured"], v["predicted"]
            eq(m["completed"], N, "requests completed")
            eq(m["failed"], 0, "requests failed")
            # The server counted the prompt it was sent (words calibrated through /tokenize).
            check(18 <= v["measured_prompt_tokens"] <= 30, f"prompt tokens per request {v['measured_prompt_tokens']}")
            # Steps and busy time come from /metrics around the counted run: every request needs 12 steps
            # (one prefill, 11 decodes), batched together at most.
            check(m["engine_steps"] is not None and 12 <= m["engine_steps"] <= N * 12,
                  f"engine steps {m['engine_steps']}")
            steps1 = metric(srv.port, "serval_engine_steps_total")
            check(m["engine_steps"] <= steps1 - steps0, "steps counted beyond what the server did")
            check(m["engine_busy_s"] > 0, f"engine busy seconds {m['engine_busy_s']}")
            # Calibration: lone requests just before and after the run, against the profile's batch-1 step (on
            # this tiny model HTTP dominates the inter-token time, so only their presence is checked here).
            cal = v["calibration"]
            check(cal["drift_before"] and cal["drift_before"] > 0 and cal["drift_after"] and cal["drift_after"] > 0,
                  f"calibration ratios {cal}")
            # The prefill side too: the lone requests' time to first token against the profile's prefill step.
            check(cal["prefill_drift_before"] and cal["prefill_drift_before"] > 0 and cal["prefill_drift_after"]
                  and cal["prefill_drift_after"] > 0, f"prefill calibration ratios {cal}")
            check("itl_s" in v["predicted_uncalibrated"] and "itl_s" in v["predicted_calibrated"],
                  "both predictions are reported")
            eq(cal["applied"], False, "calibration applied only with --calibrate")
            for k in ("ttft_s", "itl_s", "requests_per_s"):
                eq(v["predicted"][k], v["predicted_uncalibrated"][k], f"the prediction shown is the profile's own ({k})")
            # The replay sends at the modelled arrival times: with a server this fast, the run lasts the arrivals'
            # span, so requests/s agree although every latency here is HTTP, not engine.
            ratio = m["requests_per_s"] / p["requests_per_s"]
            check(0.5 <= ratio <= 1.25, f"measured {m['requests_per_s']:.2f} vs predicted {p['requests_per_s']:.2f} "
                                        "requests/s: the replay did not follow the modelled arrivals")
            # A second replay: other prompts, so nothing of the first one is found in the prefix cache.
            hits0 = metric(srv.port, "serval_prefix_cache_hits_total")
            v2 = replay()
            eq(v2["measured"]["completed"], N, "second replay: requests completed")
            hits1 = metric(srv.port, "serval_prefix_cache_hits_total")
            eq(hits1 - hits0, 0, "prefix-cache hit tokens during the second replay (its prompts must be new)")


if __name__ == "__main__":
    suite.main()
