#!/usr/bin/env python3
"""deploy/: the Kubernetes manifests and the Dockerfile, checked offline (no
cluster, no Docker engine here).

- Every kustomization (base, overlays/hpa, overlays/keda) renders with
  `kubectl kustomize`, and every rendered document validates against the
  Kubernetes, KEDA and Prometheus Operator schemas (npm kubernetes-models,
  installed from this folder's package-lock.json into the build tree); a
  broken document is rejected (the validator can fail).
- The objects fit together: selectors, ports, probes on /ready and /health,
  the grace period against --drain-timeout, read-only model volume, non-root.
- The Deployment's own arguments start a real `serval serve` (stories260K in
  place of the model, temporary folders in place of the volumes); its /metrics
  carries every metric the HPA, the ScaledObject and routers read; SIGTERM
  drains and exits 0.
- The PrometheusRule is deploy/prometheus/serval-rules.yml, unchanged.
- The Dockerfile passes the lint rules below (hadolint is not packaged in Debian 12).

Fails (never skips) when kubectl (1.21 or later: kustomize v4+) or node is
missing."""

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
import yaml  # noqa: E402

import harness  # noqa: E402
from harness import Config, Suite, check, eq, get  # noqa: E402

suite = Suite("deploy")
REPO = harness.REPO
K8S = os.path.join(REPO, "deploy", "kubernetes")
KUSTOMIZATIONS = {"base": {"Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule"},
                  "overlays/hpa": {"HorizontalPodAutoscaler"}, "overlays/keda": {"ScaledObject"}}


def render(name):
    kubectl = shutil.which("kubectl")
    check(kubectl, "kubectl (1.21 or later) is not installed: it renders the kustomizations")
    p = subprocess.run([kubectl, "kustomize", os.path.join(K8S, name)], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"kubectl kustomize {name}: {p.stderr[-2000:]}")
    return p.stdout


@suite.setup
@contextlib.contextmanager
def setup():
    work = os.environ.get("SERVAL_DEPLOY_WORK", os.path.join(REPO, "build", "tests", "deploy"))
    harness.npm_ci(HERE, ("package.json", "package-lock.json", "validate.mjs"), work)
    rendered = {name: render(name) for name in KUSTOMIZATIONS}
    yield {"work": work, "rendered": rendered,
           "docs": {name: [d for d in yaml.safe_load_all(text) if d] for name, text in rendered.items()}}


def one(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    eq(len(found), 1, f"one {kind}")
    return found[0]


def validate(ctx, text):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=ctx["work"], delete=False) as f:
        f.write(text)
    try:
        p = subprocess.run(["node", os.path.join(ctx["work"], "validate.mjs"), f.name], cwd=ctx["work"],
                           capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(f.name)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    return p.returncode, rows, p.stderr


@suite.test
def every_overlay_renders(ctx):
    base = {d["kind"] for d in ctx["docs"]["base"]}
    eq(base, KUSTOMIZATIONS["base"], "base kinds")
    for name in ("overlays/hpa", "overlays/keda"):
        eq({d["kind"] for d in ctx["docs"][name]}, base | KUSTOMIZATIONS[name], f"{name} kinds")
        check(one(ctx["docs"][name], "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
              == "serval:0.1.0", f"{name}: the image tag from the kustomization")


@suite.test
def every_document_validates_against_its_schema(ctx):
    for name, text in ctx["rendered"].items():
        rc, rows, err = validate(ctx, text)
        bad = [r for r in rows if not r["ok"]]
        check(rc == 0 and not bad, f"{name}: {bad or err}")
        eq(len(rows), len(ctx["docs"][name]), f"{name}: every document validated")


@suite.test
def a_broken_document_is_rejected(ctx):
    cases = {
        "replicas as a string": lambda d: d["spec"].__setitem__("replicas", "two"),
        "no containers": lambda d: d["spec"]["template"]["spec"].pop("containers"),
        "probe port as a list": lambda d: d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        .__setitem__("port", [8080]),
    }
    for what, breaks in cases.items():
        dep = json.loads(json.dumps(one(ctx["docs"]["base"], "Deployment")))
        breaks(dep)
        rc, rows, _ = validate(ctx, yaml.safe_dump(dep))
        check(rc != 0 and rows and not rows[0]["ok"], f"{what}: accepted ({rows})")
    rc, rows, _ = validate(ctx, "apiVersion: example.com/v1\nkind: Unknown\nmetadata: {name: x}\n")
    check(rc != 0 and "no schema" in rows[0]["error"], f"an unknown kind passes ({rows})")
    so = json.loads(json.dumps(one(ctx["docs"]["overlays/keda"], "ScaledObject")))
    so["spec"]["triggers"] = "prometheus"
    rc, rows, _ = validate(ctx, yaml.safe_dump(so))
    check(rc != 0, f"a ScaledObject with triggers as a string passes ({rows})")


def container(docs):
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def flag(args, name):
    i = args.index(name)
    return args[i + 1]


@suite.test
def the_objects_fit_together(ctx):
    docs = ctx["docs"]["overlays/hpa"]
    dep, svc, pdb, sm = (one(docs, k) for k in ("Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor"))
    labels = dep["spec"]["template"]["metadata"]["labels"]
    for what, sel in (("deployment", dep["spec"]["selector"]["matchLabels"]), ("service", svc["spec"]["selector"]),
                      ("pdb", pdb["spec"]["selector"]["matchLabels"])):
        check(sel.items() <= labels.items(), f"{what} selector {sel} matches the pod labels {labels}")
    check(sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(), "ServiceMonitor → Service")
    c = container(docs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    eq(svc["spec"]["ports"][0]["targetPort"], "http", "service targets the named port")
    check("http" in ports and sm["spec"]["endpoints"][0]["port"] == "http", "scrape port")
    eq(str(ports["http"]), flag(c["args"], "--port"), "containerPort is serve's --port")
    eq(c["readinessProbe"]["httpGet"]["path"], "/ready", "readiness")
    eq(c["livenessProbe"]["httpGet"]["path"], "/health", "liveness")
    eq(c["startupProbe"]["httpGet"]["path"], "/health", "startup")
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(flag(c["args"], "--drain-timeout"))
    check(grace >= pre_stop + drain + 10, f"grace period {grace} s < preStop {pre_stop} + drain {drain} + 10")
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    check(mounts["models"].get("readOnly") and volumes["models"]["persistentVolumeClaim"].get("readOnly"),
          "models mounted read-only")
    check(flag(c["args"], "--model").startswith(mounts["models"]["mountPath"] + "/"), "the model is on the volume")
    check(dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"], "non-root")
    check(c["securityContext"]["readOnlyRootFilesystem"] and not c["securityContext"]["allowPrivilegeEscalation"],
          "read-only root, no privilege escalation")
    # Every path serve writes is on a writable volume.
    writable = [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")]
    for opt in ("--batch-dir", "--kv-cache-dir"):
        check(any(flag(c["args"], opt).startswith(w + "/") for w in writable), f"{opt} on a writable volume")
    check(c["resources"]["requests"]["cpu"] == flag(c["args"], "--threads"), "CPU request = compute threads")
    for name, kind in (("overlays/hpa", "HorizontalPodAutoscaler"), ("overlays/keda", "ScaledObject")):
        ref = one(ctx["docs"][name], kind)["spec"]["scaleTargetRef"]
        eq((ref["kind"], ref["name"]), ("Deployment", dep["metadata"]["name"]), f"{kind} target")


@suite.test
def prometheusrule_is_the_rules_file(ctx):
    with open(os.path.join(REPO, "deploy", "prometheus", "serval-rules.yml")) as f:
        rules = yaml.safe_load(f)
    eq(one(ctx["docs"]["base"], "PrometheusRule")["spec"]["groups"], rules["groups"],
       "PrometheusRule groups (run deploy/kubernetes/gen_prometheusrule.py after changing the rules)")


def autoscaler_metrics(ctx):
    names = set()
    hpa = one(ctx["docs"]["overlays/hpa"], "HorizontalPodAutoscaler")
    names |= {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    so = one(ctx["docs"]["overlays/keda"], "ScaledObject")
    for t in so["spec"]["triggers"]:
        names |= set(re.findall(r"\b(serval_[a-z_]+)", t["metadata"]["query"]))
    return names


@suite.test
def the_deployments_arguments_start_a_real_server(ctx):
    c = container(ctx["docs"]["overlays/hpa"])
    check(c["args"][0] == "serve", "the container runs serve")
    with tempfile.TemporaryDirectory(prefix="serval-deploy-") as tmp:
        key = "sk-deploy-test"
        with open(os.path.join(tmp, "api-keys"), "w") as f:
            f.write(key + "\n")
        subst = {flag(c["args"], "--model"): Config.model(), flag(c["args"], "--api-key-file"): os.path.join(tmp, "api-keys"),
                 "0.0.0.0": "127.0.0.1", flag(c["args"], "--port"): "0", flag(c["args"], "--threads"): "1",
                 flag(c["args"], "--kv-memory"): "64M", flag(c["args"], "--drain-timeout"): "5"}
        args = [subst.get(a, a) for a in c["args"]]
        state = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "state")
        args = [a.replace(state, os.path.join(tmp, "state")) for a in args]
        log_path = os.path.join(tmp, "serve.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([Config.serval] + args, stdout=log, stderr=subprocess.STDOUT)
        try:
            port = None
            deadline = time.monotonic() + 60
            while port is None and time.monotonic() < deadline and proc.poll() is None:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+) ", open(log_path).read())
                port = int(m.group(1)) if m else None
                time.sleep(0.05)
            check(port, f"serve did not start with the Deployment's arguments: {open(log_path).read()[-2000:]}")
            auth = {"Authorization": f"Bearer {key}"}
            eq(get(port, "/health").status, 200, "/health (no key: the liveness probe sends none)")
            eq(get(port, "/ready", headers=auth).status, 200, "/ready")
            r = get(port, "/metrics", headers=auth)
            eq(r.status, 200, "/metrics with the key")
            text = r.body.decode()
            names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
            for n in sorted(autoscaler_metrics(ctx)):
                check(n in names, f"{n}, read by an autoscaler, is not on /metrics")
            for n in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                      "vllm:gpu_cache_usage_perc", "vllm:cache_config_info", "vllm:lora_requests_info"):
                check(n in names, f"{n} (--metrics-compat vllm) is not on /metrics")
            proc.send_signal(signal.SIGTERM)
            eq(proc.wait(timeout=30), 0, "exit status after SIGTERM")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------- Dockerfile

def dockerfile_instructions(text):
    """(line number, instruction, arguments) with continuation lines joined."""
    out, buf, start = [], "", 0
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if not buf:
            start = i
        buf += " " + s.rstrip("\\").strip() if buf else s.rstrip("\\").strip()
        if not s.endswith("\\"):
            word, _, rest = buf.partition(" ")
            out.append((start, word.upper(), rest.strip()))
            buf = ""
    return out


def lint_dockerfile(text, repo):
    """hadolint's rules that matter here, as one-line problems."""
    problems = []
    ins = dockerfile_instructions(text)
    stages, final_user, has_health = [], None, False
    for n, word, arg in ins:
        if word == "FROM":
            image, *rest = arg.split()
            if image not in stages and (":" not in image or image.endswith(":latest")):
                problems.append(f"line {n}: base image '{image}' without a pinned tag (DL3006/DL3007)")
            if len(rest) == 2 and rest[0].upper() == "AS":
                stages.append(rest[1])
            final_user = None
        elif word == "RUN":
            if "apt-get install" in arg:
                if "--no-install-recommends" not in arg:
                    problems.append(f"line {n}: apt-get install without --no-install-recommends (DL3015)")
                if "-y" not in arg.split():
                    problems.append(f"line {n}: apt-get install without -y (DL3014)")
                if "rm -rf /var/lib/apt/lists" not in arg:
                    problems.append(f"line {n}: apt lists not removed in the same RUN (DL3009)")
            if re.search(r"(^|\s)(sudo)\s", arg):
                problems.append(f"line {n}: sudo in RUN (DL3004)")
            if re.search(r"(^|&&\s*)cd\s", arg):
                problems.append(f"line {n}: cd in RUN; use WORKDIR (DL3003)")
        elif word == "ADD":
            problems.append(f"line {n}: ADD; use COPY (DL3020)")
        elif word == "COPY":
            parts = [p for p in arg.split() if not p.startswith("--chown")]
            if parts and parts[0].startswith("--from="):
                src = parts[0].split("=", 1)[1]
                if src not in stages:
                    problems.append(f"line {n}: COPY --from={src}: no such earlier stage")
            else:
                for p in parts[:-1]:
                    if not os.path.exists(os.path.join(repo, p)):
                        problems.append(f"line {n}: COPY source '{p}' does not exist in the repository")
        elif word == "WORKDIR" and not arg.startswith("/"):
            problems.append(f"line {n}: relative WORKDIR (DL3000)")
        elif word == "USER":
            final_user = arg
        elif word == "HEALTHCHECK":
            has_health = True
        elif word in ("CMD", "ENTRYPOINT") and not arg.startswith("["):
            problems.append(f"line {n}: {word} in shell form; use the JSON form (DL3025)")
    if final_user is None or final_user.split(":")[0] in ("root", "0"):
        problems.append("the final stage runs as root (DL3002): add USER")
    if not has_health:
        problems.append("no HEALTHCHECK")
    return problems


@suite.test
def dockerfile_lint(ctx):
    with open(os.path.join(REPO, "Dockerfile")) as f:
        text = f.read()
    eq(lint_dockerfile(text, REPO), [], "Dockerfile lint")
    ins = dockerfile_instructions(text)
    health = next(a for _, w, a in ins if w == "HEALTHCHECK")
    check("/health" in health, f"HEALTHCHECK on /health: {health}")
    froms = [a.split()[0] for _, w, a in ins if w == "FROM"]
    check(froms[-1].startswith("debian:12"), f"runtime on Debian 12: {froms}")
    check(any("install-deps.sh" in a for _, w, a in ins if w == "RUN"), "built with the project's install script")
    # The lint itself catches what it claims to.
    bad = "FROM debian\nADD . /src\nRUN cd /src && apt-get install curl\nCMD serve\n"
    found = " ".join(lint_dockerfile(bad, REPO))
    for rule in ("DL3006", "DL3020", "DL3003", "DL3015", "DL3014", "DL3009", "DL3025", "DL3002", "HEALTHCHECK"):
        check(rule in found, f"the lint misses {rule}: {found}")


if __name__ == "__main__":
    suite.main()
