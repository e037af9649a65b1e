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
- The gateway (Deployment, ConfigMap, Services, ledger volume) fits the
  replicas: its config's upstream is the headless Service of the serve pods,
  its files are on its volumes; the ConfigMap's gateway.toml runs a real
  `serval gateway` in front of a real serve, and its /metrics has what the
  ScaledObject's scale-from-zero trigger reads. The readiness probe's own
  command (it sends the key) passes against the real serve.
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
KUSTOMIZATIONS = {"base": {"Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule", "ConfigMap",
                           "PersistentVolumeClaim"},
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


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    eq(len(found), 1, f"one {kind}" + (f" named {name}" if name else ""))
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
        for dep in (d for d in ctx["docs"][name] if d["kind"] == "Deployment"):
            check(dep["spec"]["template"]["spec"]["containers"][0]["image"] == "serval:0.1.0",
                  f"{name}: {dep['metadata']['name']}: the image tag from the kustomization")


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
        "probe port as a list": lambda d: d["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]
        .__setitem__("port", [8080]),
        "probe command as a string": lambda d: d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]
        .__setitem__("command", "curl"),
    }
    for what, breaks in cases.items():
        dep = json.loads(json.dumps(one(ctx["docs"]["base"], "Deployment", "serval")))
        breaks(dep)
        rc, rows, _ = validate(ctx, yaml.safe_dump(dep))
        check(rc != 0 and rows and not rows[0]["ok"], f"{what}: accepted ({rows})")
    rc, rows, _ = validate(ctx, "apiVersion: example.com/v1\nkind: Unknown\nmetadata: {name: x}\n")
    check(rc != 0 and "no schema" in rows[0]["error"], f"an unknown kind passes ({rows})")
    so = json.loads(json.dumps(one(ctx["docs"]["overlays/keda"], "ScaledObject")))
    so["spec"]["triggers"] = "prometheus"
    rc, rows, _ = validate(ctx, yaml.safe_dump(so))
    check(rc != 0, f"a ScaledObject with triggers as a string passes ({rows})")


def container(docs, name="serval"):
    return one(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]


def flag(args, name):
    i = args.index(name)
    return args[i + 1]


@suite.test
def the_objects_fit_together(ctx):
    docs = ctx["docs"]["overlays/hpa"]
    dep, svc, pdb, sm = (one(docs, k, "serval") for k in ("Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor"))
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
    ready = c["readinessProbe"]["exec"]["command"][-1]
    check(f"http://127.0.0.1:{ports['http']}/ready" in ready, f"readiness probes /ready on the container port: {ready}")
    check(flag(c["args"], "--api-key-file") in ready, "the readiness probe sends the key from --api-key-file")
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
    eq(one(ctx["docs"]["base"], "PrometheusRule", "serval")["spec"]["groups"], rules["groups"],
       "PrometheusRule groups (run deploy/kubernetes/gen_prometheusrule.py after changing the rules)")


def autoscaler_metrics(ctx):
    names = set()
    hpa = one(ctx["docs"]["overlays/hpa"], "HorizontalPodAutoscaler")
    names |= {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    so = one(ctx["docs"]["overlays/keda"], "ScaledObject")
    for t in so["spec"]["triggers"]:
        # The gateway's own (serval_gateway_*) are checked on a real gateway below.
        names |= set(re.findall(r"\b(serval_(?!gateway_)[a-z_]+)", t["metadata"]["query"]))
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
            # The readiness probe's own command (the key from the mounted file) passes; with a wrong key it fails.
            probe = [a.replace(flag(c["args"], "--api-key-file"), os.path.join(tmp, "api-keys"))
                     .replace(f"127.0.0.1:{flag(c['args'], '--port')}", f"127.0.0.1:{port}") for a in c["readinessProbe"]["exec"]["command"]]
            p = subprocess.run(probe, capture_output=True, text=True, timeout=30)
            eq(p.returncode, 0, f"the readiness probe against the real server ({p.stderr.strip()})")
            with open(os.path.join(tmp, "wrong-key"), "w") as f:
                f.write("sk-wrong\n")
            bad = [a.replace(os.path.join(tmp, "api-keys"), os.path.join(tmp, "wrong-key")) for a in probe]
            check(subprocess.run(bad, capture_output=True, timeout=30).returncode != 0, "the probe passes with a wrong key")
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


def gateway_toml(ctx):
    return one(ctx["docs"]["base"], "ConfigMap", "serval-gateway")["data"]["gateway.toml"]


def toml_value(text, key):
    """The first `key = value` of a TOML text (Debian 12's Python 3.11 has tomllib)."""
    import tomllib
    doc = tomllib.loads(text)
    for part in key.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


@suite.test
def the_gateway_fits_together(ctx):
    docs = ctx["docs"]["base"]
    dep, svc, sm = (one(docs, k, "serval-gateway") for k in ("Deployment", "Service", "ServiceMonitor"))
    headless = one(docs, "Service", "serval-headless")
    serve_dep = one(docs, "Deployment", "serval")
    text = gateway_toml(ctx)
    c = container(docs, "serval-gateway")
    eq(c["args"][:2], ["gateway", "--config"], "the container runs the gateway")
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    eq(volumes["config"]["configMap"]["name"], "serval-gateway", "config volume")
    eq(c["args"][2], mounts["config"]["mountPath"] + "/gateway.toml", "--config is the ConfigMap's file")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    eq(ports["http"], toml_value(text, "server.port"), "containerPort is the gateway's port")
    eq(toml_value(text, "server.host"), "0.0.0.0", "listens on every address")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    check(svc["spec"]["selector"].items() <= labels.items(), "the gateway Service selects the gateway pods")
    check(sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(), "ServiceMonitor → gateway Service")
    # The upstream is the headless Service, which selects the serve pods on their port.
    eq(headless["spec"]["clusterIP"], "None", "headless")
    check(headless["spec"]["selector"].items() <= serve_dep["spec"]["template"]["metadata"]["labels"].items(),
          "the headless Service selects the serve pods")
    upstream = toml_value(text, "models.0.upstreams")[0]
    eq(toml_value(text, "models.0.discovery"), "dns", "DNS discovery of replicas")
    eq(upstream, f"http://{headless['metadata']['name']}:{headless['spec']['ports'][0]['port']}", "upstream URL")
    eq(flag(container(docs)["args"], "--port"), str(headless["spec"]["ports"][0]["port"]), "headless port = serve's --port")
    # The files it reads and writes are on its volumes.
    check(toml_value(text, "models.0.api_key_file").startswith(mounts["api-keys"]["mountPath"] + "/"), "api_key_file on the Secret")
    eq(volumes["api-keys"]["secret"]["secretName"],
       next(v for v in serve_dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-keys")["secret"]["secretName"],
       "the gateway reads the replicas' key Secret")
    check(toml_value(text, "auth.db").startswith(mounts["state"]["mountPath"] + "/") and not mounts["state"].get("readOnly"),
          "the ledger is on the writable state volume")
    pvc = one(docs, "PersistentVolumeClaim", volumes["state"]["persistentVolumeClaim"]["claimName"])
    eq(pvc["spec"]["accessModes"], ["ReadWriteOnce"], "ledger volume")
    eq(dep["spec"]["strategy"]["type"], "Recreate", "one pod at a time on the ReadWriteOnce volume")
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    check(grace >= pre_stop + toml_value(text, "server.drain_timeout_s") + 10, "grace period covers the drain")
    eq(c["readinessProbe"]["httpGet"]["path"], "/health", "ready while it runs (it holds requests at zero replicas)")
    check(toml_value(text, "routing.queue_timeout_s") >= 60, "requests wait long enough for a replica to load its model")
    so = one(ctx["docs"]["overlays/keda"], "ScaledObject")
    eq(so["spec"]["minReplicaCount"], 0, "KEDA scales the replicas to zero")
    queued = [t for t in so["spec"]["triggers"] if "serval_gateway_requests_queued" in t["metadata"]["query"]]
    check(queued and queued[0]["metadata"].get("activationThreshold") == "0", "the gateway's queue activates from zero")
    check('service="serval-gateway"' in queued[0]["metadata"]["query"], "the trigger reads the gateway's series")


@suite.test
def the_gateway_configmap_runs_a_real_gateway(ctx):
    """The ConfigMap's gateway.toml in front of a real serve (stories260K),
    names and paths replaced by local ones: keys, a request through it, the
    metrics KEDA reads, SIGTERM exit 0."""
    import hashlib
    text = gateway_toml(ctx)
    with tempfile.TemporaryDirectory(prefix="serval-deploy-gw-") as tmp:
        key = "sk-deploy-replica"
        with open(os.path.join(tmp, "api-keys"), "w") as f:
            f.write(key + "\n")
        with harness.Server("--api-key", key, "--served-model-name", toml_value(text, "models.0.name"), name="replica") as srv:
            local = (text.replace(toml_value(text, "models.0.upstreams")[0], f"http://localhost:{srv.port}")
                     .replace(toml_value(text, "models.0.api_key_file"), os.path.join(tmp, "api-keys"))
                     .replace(toml_value(text, "auth.db"), os.path.join(tmp, "gateway.db")))
            p = subprocess.run([Config.serval, "gateway", "--config", "/dev/stdin", "--check"], input=local,
                               capture_output=True, text=True)
            eq(p.returncode, 0, f"gateway --check on the ConfigMap's file: {p.stderr}")
            with harness.Gateway(local) as gw:
                admin = {"Authorization": "Bearer change-me-admin-key"}
                eq(hashlib.sha256(b"change-me-admin-key").hexdigest(), toml_value(text, "auth.admin_key_sha256"),
                   "the documented placeholder admin key")
                r = harness.post(gw.port, "/v1/gateway/keys", {"name": "deploy-test", "rpm": 60}, headers=admin)
                eq(r.status, 201, f"key made through the admin route: {r.body[:300]!r}")
                user = {"Authorization": "Bearer " + r.json()["key"]}
                r = harness.post(gw.port, "/v1/completions", {"model": toml_value(text, "models.0.name"), "prompt": "Once",
                                                              "max_tokens": 4}, headers=user)
                eq(r.status, 200, f"a completion through the gateway: {r.body[:300]!r}")
                m = get(gw.port, "/metrics").body.decode()
                so = one(ctx["docs"]["overlays/keda"], "ScaledObject")
                for t in so["spec"]["triggers"]:
                    for n in re.findall(r"\b(serval_gateway_[a-z_]+)", t["metadata"]["query"]):
                        check(f"\n{n}" in m, f"{n}, read by the ScaledObject, is not on the gateway's /metrics")
                gw.signal(signal.SIGTERM)
                eq(gw.wait(30), 0, "gateway exit status after SIGTERM")


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


def runtime_packages(text):
    """The packages the Dockerfile's runtime stage installs with apt-get."""
    stage = text[text.index("AS runtime"):]
    run = next(args for _, ins, args in dockerfile_instructions(stage) if ins == "RUN" and "apt-get install" in args)
    words = run.split("apt-get install", 1)[1].split("&&")[0].split()
    return {w for w in words if not w.startswith("-")}


def dpkg_closure(pkgs):
    """pkgs and everything they depend on (installed packages, from dpkg's status)."""
    seen, todo = set(), list(pkgs)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        out = subprocess.run(["dpkg-query", "-W", "-f=${Depends},${Pre-Depends}", p], capture_output=True, text=True).stdout
        for alt in out.replace("|", ",").split(","):
            name = alt.strip().split(" ")[0].split(":")[0]
            if name:
                todo.append(name)
    return seen


@suite.test
def the_runtime_image_has_every_library_the_binary_links(ctx):
    """Each shared library `serval` links comes from a package the runtime
    stage installs (or one those, or debian:12-slim's apt, pull in)."""
    if not shutil.which("dpkg-query") or not shutil.which("ldd"):
        raise harness.SkipTest("needs dpkg-query and ldd (Debian)")
    with open(os.path.join(REPO, "Dockerfile")) as f:
        runtime = runtime_packages(f.read())
    allowed = dpkg_closure(runtime | {"apt", "dpkg", "libc6"})
    libs = re.findall(r"=> (/\S+)", subprocess.run(["ldd", Config.serval], capture_output=True, text=True).stdout)
    check(libs, "ldd found no libraries")
    missing = []
    for lib in libs:
        real = os.path.realpath(lib)
        owner = ""
        for path in (lib, real, real.replace("/usr/lib/", "/lib/", 1), lib.replace("/lib/", "/usr/lib/", 1)):
            p = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True)
            if p.returncode == 0:
                owner = p.stdout.split(":")[0].strip()
                break
        check(owner, f"no package owns {lib}")
        if owner not in allowed:
            missing.append(f"{os.path.basename(lib)} ({owner})")
    check(not missing, f"the runtime stage lacks packages for: {', '.join(missing)}")


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
