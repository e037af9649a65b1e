#!/usr/bin/env python3
"""End-to-end tests of every endpoint of `serval serve` and the request options
(streaming and not, n, stop, max_tokens, logprobs/top_logprobs, echo, seed,
finish_reason, usage), with curl and with Python's http.client, against the
tiny stories260K model. The greedy completion is checked against llama.cpp's
golden output in ../shared/golden/stories260K-greedy.json."""

import contextlib
import json
import shutil
import socket
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import (  # noqa: E402
    Config, Server, Suite, check, eq, get, parse_metrics, parse_raw_response, post, raw_exchange, short, stream)

suite = Suite("server_api")
MODEL_ID = "stories260K"
GOLDEN_TOL = 1e-3  # |log-prob - llama.cpp's|; an all-F32 pass lands near 1e-5


class Ctx:
    port = None
    golden = None


@suite.setup
@contextlib.contextmanager
def setup():
    # The golden's conditions: llama.cpp ran with an F32 KV cache (../shared/DESIGN.md);
    # the default (F16) is what every other suite runs.
    with Server("--served-model-name", MODEL_ID, "--kv-type", "f32", name="api") as srv:
        ctx = Ctx()
        ctx.port = srv.port
        ctx.srv = srv
        ctx.golden = Config.golden()
        yield ctx


def completion(ctx, **body):
    r = post(ctx.port, "/v1/completions", body)
    eq(r.status, 200, f"POST /v1/completions {short(body, 200)} status ({short(r.body, 300)})")
    return r.json()


def chat(ctx, **body):
    r = post(ctx.port, "/v1/chat/completions", body)
    eq(r.status, 200, f"POST /v1/chat/completions {short(body, 200)} status ({short(r.body, 300)})")
    return r.json()


def check_usage(u, prompt_tokens=None, completion_tokens=None, what="usage"):
    check(isinstance(u, dict), f"{what}: missing ({u!r})")
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        check(isinstance(u.get(k), int) and u[k] >= 0, f"{what}.{k} must be a non-negative integer: {u}")
    eq(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"], f"{what}.total_tokens = prompt + completion")
    if prompt_tokens is not None:
        eq(u["prompt_tokens"], prompt_tokens, f"{what}.prompt_tokens")
    if completion_tokens is not None:
        eq(u["completion_tokens"], completion_tokens, f"{what}.completion_tokens")


GOLD_PROMPT = "Once upon a time"
USER_MSG = [{"role": "user", "content": "Tell me a story about a cat."}]


# ------------------------------------------------------------------ curl: every endpoint

def curl(ctx, *args, data=None):  # noqa: ARG001
    if not shutil.which("curl"):
        raise AssertionError("curl is not installed (scripts/install-deps.sh installs it)")
    cmd = ["curl", "-sS", "-N", "--max-time", "60", "-o", "-", "-w", "\n%{http_code}", *args]
    if data is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(data)]
    p = subprocess.run(cmd, capture_output=True, timeout=90)
    check(p.returncode == 0, f"curl {' '.join(args)} failed ({p.returncode}): {p.stderr.decode()}")
    out, _, code = p.stdout.decode().rpartition("\n")
    return int(code), out


def url(ctx, path):
    return f"http://127.0.0.1:{ctx.port}{path}"


def sse_events(text):
    lines = [ln for ln in text.split("\n") if ln.strip()]
    check(all(ln.startswith("data: ") for ln in lines), f"non-SSE lines in {short(text)}")
    check(lines and lines[-1] == "data: [DONE]", f"stream does not end with 'data: [DONE]': {short(text[-300:])}")
    return [json.loads(ln[6:]) for ln in lines[:-1]]


@suite.test
def curl_health_ready_models(ctx):
    code, out = curl(ctx, url(ctx, "/health"))
    eq(code, 200, "curl GET /health")
    eq(json.loads(out).get("status"), "ok", "/health status")
    code, out = curl(ctx, url(ctx, "/ready"))
    eq(code, 200, "curl GET /ready")
    code, out = curl(ctx, url(ctx, "/v1/models"))
    eq(code, 200, "curl GET /v1/models")
    j = json.loads(out)
    eq(j.get("object"), "list", "/v1/models object")
    eq([m.get("id") for m in j.get("data", [])], [MODEL_ID], "/v1/models ids (--served-model-name)")
    eq(j["data"][0].get("object"), "model", "/v1/models data[0].object")


@suite.test
def curl_metrics(ctx):
    code, out = curl(ctx, url(ctx, "/metrics"))
    eq(code, 200, "curl GET /metrics")
    check("# HELP " in out and "# TYPE " in out, f"/metrics has no # HELP / # TYPE lines: {short(out)}")


@suite.test
def curl_tokenize_detokenize(ctx):
    case = ctx.golden["cases"][0]
    code, out = curl(ctx, url(ctx, "/tokenize"), data={"prompt": case["prompt"]})
    eq(code, 200, "curl POST /tokenize")
    eq(json.loads(out).get("tokens"), case["prompt_tokens"], "/tokenize tokens (golden prompt ids, with BOS)")
    code, out = curl(ctx, url(ctx, "/detokenize"), data={"tokens": case["greedy_tokens"]})
    eq(code, 200, "curl POST /detokenize")
    eq(json.loads(out).get("prompt"), case["greedy_text"], "/detokenize of the golden tokens")


@suite.test
def curl_completion(ctx):
    code, out = curl(ctx, url(ctx, "/v1/completions"),
                     data={"model": MODEL_ID, "prompt": GOLD_PROMPT, "max_tokens": 8, "temperature": 0})
    eq(code, 200, "curl POST /v1/completions")
    j = json.loads(out)
    eq(j.get("object"), "text_completion", "object")
    check(ctx.golden["cases"][0]["greedy_text"].startswith(j["choices"][0]["text"]),
          f"text is not a prefix of the golden text: {j['choices'][0]['text']!r}")
    code, out = curl(ctx, url(ctx, "/v1/completions"),
                     data={"prompt": GOLD_PROMPT, "max_tokens": 8, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
    eq(code, 200, "curl POST /v1/completions stream")
    evs = sse_events(out)
    eq("".join(c["text"] for e in evs for c in e["choices"]), j["choices"][0]["text"], "streamed text = non-streamed")
    check_usage(evs[-1].get("usage"), 5, 8, "streamed usage")


@suite.test
def curl_chat(ctx):
    code, out = curl(ctx, url(ctx, "/v1/chat/completions"),
                     data={"model": MODEL_ID, "messages": USER_MSG, "max_tokens": 8, "temperature": 0})
    eq(code, 200, "curl POST /v1/chat/completions")
    j = json.loads(out)
    eq(j.get("object"), "chat.completion", "object")
    text = j["choices"][0]["message"]["content"]
    code, out = curl(ctx, url(ctx, "/v1/chat/completions"),
                     data={"messages": USER_MSG, "max_tokens": 8, "temperature": 0, "stream": True})
    eq(code, 200, "curl POST /v1/chat/completions stream")
    evs = sse_events(out)
    eq("".join((c["delta"].get("content") or "") for e in evs for c in e["choices"]), text,
       "streamed chat text = non-streamed")


# ------------------------------------------------------------------ health, models, metrics

@suite.test
def health_and_ready(ctx):
    r = get(ctx.port, "/health")
    eq(r.status, 200, "GET /health")
    check(r.header("content-type").startswith("application/json"), "GET /health Content-Type")
    r = get(ctx.port, "/ready")
    eq(r.status, 200, "GET /ready")


@suite.test
def models_list(ctx):
    j = get(ctx.port, "/v1/models").json()
    eq(j["object"], "list", "object")
    m = j["data"][0]
    eq(m["id"], MODEL_ID, "id")
    check(isinstance(m.get("created"), int), f"created must be an integer: {m}")
    check(isinstance(m.get("owned_by"), str), f"owned_by must be a string: {m}")


@suite.test
def model_aliases(ctx):
    """--alias ids are listed and accepted, the file's name (with or without .gguf) is accepted, others get 404;
    a bad --alias stops the server at start with a one-line message."""
    with Server("--alias", "tiny-stories", "--alias", "team/stories:v1", name="aliases") as srv:
        ids = [m["id"] for m in get(srv.port, "/v1/models").json()["data"]]
        eq(ids[1:], ["tiny-stories", "team/stories:v1"], "/v1/models: general.name, then the aliases")
        for mid in ("tiny-stories", "team/stories:v1", "stories260K.gguf", "stories260K", ids[0]):
            r = post(srv.port, "/v1/completions", {"model": mid, "prompt": GOLD_PROMPT, "max_tokens": 2})
            eq(r.status, 200, f"model {mid!r} accepted ({short(r.body, 200)})")
            eq(r.json()["model"], mid, "the response names the model asked for")
        r = post(srv.port, "/v1/completions", {"model": "stories", "prompt": GOLD_PROMPT, "max_tokens": 2})
        eq(r.status, 404, "an unknown model id")
        eq(r.json()["error"]["code"], "model_not_found", "error code")
    for bad in ("", "x" * 300, "a\nb"):
        p = subprocess.run([Config.serval, "serve", "-m", Config.model(), "--port", "0", "--alias", bad],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode != 0, f"--alias {bad[:20]!r} should refuse to start")
        check("--alias" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
              f"--alias {bad[:20]!r}: one line naming the flag, got {p.stderr!r}")


@suite.test
def metrics_format(ctx):
    completion(ctx, prompt=GOLD_PROMPT, max_tokens=3)  # something to count
    r = get(ctx.port, "/metrics")
    eq(r.status, 200, "GET /metrics")
    check(r.header("content-type").startswith("text/plain"), f"Content-Type: {r.header('content-type')}")
    text = r.body.decode()
    samples, helps, types = parse_metrics(text)
    check(samples, "no samples")
    def family(name):  # a histogram's samples are name_bucket, name_sum, name_count
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
                return name[: -len(suffix)]
        return name
    for name in map(family, samples):
        check(name in helps, f"{name}: no '# HELP {name}' line")
        check(name in types, f"{name}: no '# TYPE {name}' line")
        check(name.startswith("serval_"), f"{name}: metric names start with serval_")
    for name, t in types.items():
        check(t in ("counter", "gauge", "histogram", "summary", "untyped"), f"{name}: unknown type {t}")
        if t == "counter":
            check(name.endswith("_total"), f"counter {name} must end in _total")
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = family(line.split("{")[0].split(" ")[0])
            check(name in types, f"sample line before its # TYPE: {line}")
    for need in ("serval_kv_blocks_used", "serval_requests_running", "serval_requests_waiting",
                 "serval_prompt_tokens_total", "serval_generation_tokens_total", "serval_http_responses_total"):
        check(need in samples, f"/metrics lacks {need}")


@suite.test
def metrics_total_suffix_only_on_counters(ctx):
    # Prometheus naming: the _total suffix is reserved for counters
    # (promtool check metrics: "non-counter metrics should not have _total suffix").
    _, _, types = parse_metrics(get(ctx.port, "/metrics").body.decode())
    bad = [f"{n} ({t})" for n, t in types.items() if n.endswith("_total") and t != "counter"]
    check(not bad, f"non-counter metrics named *_total: {', '.join(bad)}")


@suite.test
def metrics_count_requests(ctx):
    before = _metric_sums(ctx)
    completion(ctx, prompt=GOLD_PROMPT, max_tokens=7, temperature=0)
    after = _metric_sums(ctx)
    eq(after.get("serval_generation_tokens_total", 0) - before.get("serval_generation_tokens_total", 0), 7,
       "serval_generation_tokens_total increase after a 7-token completion")
    eq(after.get("serval_prompt_tokens_total", 0) - before.get("serval_prompt_tokens_total", 0), 5,
       "serval_prompt_tokens_total increase after a 5-token prompt")
    check(after.get('serval_http_responses_total{code="200"}', 0) > before.get('serval_http_responses_total{code="200"}', 0),
          "serval_http_responses_total{code=\"200\"} did not increase")
    eq(after.get("serval_kv_blocks_used"), 0, "serval_kv_blocks_used when idle")
    eq(after.get("serval_requests_running"), 0, "serval_requests_running when idle")


def _metric_sums(ctx):
    samples, _, _ = parse_metrics(get(ctx.port, "/metrics").body.decode())
    out = {}
    for name, vals in samples.items():
        out[name] = sum(v for _, v in vals)
        for lbl, v in vals:
            if "code" in lbl:
                out[f'{name}{{code="{lbl["code"]}"}}'] = v
    return out


# ------------------------------------------------------------------ tokenize / detokenize

@suite.test
def tokenize_detokenize(ctx):
    for case in ctx.golden["cases"]:
        j = post(ctx.port, "/tokenize", {"prompt": case["prompt"]}).json()
        eq(j["tokens"], case["prompt_tokens"], f"tokenize {case['prompt']!r}")
        eq(j.get("count"), len(case["prompt_tokens"]), "count")
        j = post(ctx.port, "/tokenize", {"prompt": case["prompt"], "add_special": False}).json()
        eq(j["tokens"], case["prompt_tokens"][1:], f"tokenize {case['prompt']!r} add_special=false (no BOS)")
        j = post(ctx.port, "/detokenize", {"tokens": case["prompt_tokens"]}).json()
        eq(j["prompt"], case["prompt"], "detokenize round trip (ids with BOS)")
        j = post(ctx.port, "/detokenize", {"tokens": case["prompt_tokens"][1:]}).json()
        eq(j["prompt"], case["prompt"], "detokenize round trip (ids without BOS: no leading space)")


@suite.test
def tokenize_messages_matches_chat_usage(ctx):
    t = post(ctx.port, "/tokenize", {"messages": USER_MSG}).json()
    j = chat(ctx, messages=USER_MSG, max_tokens=2)
    eq(j["usage"]["prompt_tokens"], t["count"], "chat usage.prompt_tokens = /tokenize count of the same messages")


# ------------------------------------------------------------------ golden greedy

@suite.test
def golden_greedy_completion(ctx):
    case = ctx.golden["cases"][0]
    eq(case["prompt"], GOLD_PROMPT, "golden case 0 prompt")
    j = completion(ctx, model=MODEL_ID, prompt=case["prompt"], max_tokens=200, temperature=0)
    eq(j["choices"][0]["text"], case["greedy_text"], "greedy text vs golden (llama.cpp)")
    eq(j["choices"][0]["finish_reason"], "length", "finish_reason")
    check_usage(j["usage"], len(case["prompt_tokens"]), 200)
    eq(j["model"], MODEL_ID, "model")
    check(j["id"].startswith("cmpl"), f"id {j['id']}")


@suite.test
def golden_greedy_stream(ctx):
    case = ctx.golden["cases"][0]
    s = stream(ctx.port, "/v1/completions", {"prompt": case["prompt"], "max_tokens": 200, "temperature": 0,
                                               "stream": True, "stream_options": {"include_usage": True}})
    s.check_well_formed("stream")
    eq(s.text(), case["greedy_text"], "streamed greedy text vs golden")
    eq(s.finish_reason(), ["length"], "finish_reason in the stream (exactly once)")
    last = s.events[-1]
    eq(last.get("choices"), [], "the usage chunk has choices: []")
    check_usage(last.get("usage"), len(case["prompt_tokens"]), 200, "usage chunk")
    ids = {e["id"] for e in s.events}
    eq(len(ids), 1, "one id for all chunks")
    eq({e["object"] for e in s.events}, {"text_completion"}, "chunk object")


@suite.test
def golden_prompt_as_token_ids(ctx):
    for case in ctx.golden["cases"][:3]:
        j = completion(ctx, prompt=case["prompt_tokens"], max_tokens=200, temperature=0)
        eq(j["choices"][0]["text"], case["greedy_text"], f"greedy text from token-id prompt {case['prompt_tokens']}")
        eq(j["usage"]["prompt_tokens"], len(case["prompt_tokens"]), "prompt_tokens")


@suite.test
def golden_logprobs(ctx):
    for case in ctx.golden["cases"]:
        j = completion(ctx, prompt=case["prompt"], max_tokens=200, temperature=0, logprobs=5)
        ch = j["choices"][0]
        eq(ch["text"], case["greedy_text"], f"greedy text of {case['prompt']!r}")
        lp = ch["logprobs"]
        for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            eq(len(lp[k]), 200, f"len(logprobs.{k})")
        eq("".join(lp["tokens"]), ch["text"], "concatenated logprobs.tokens = text")
        worst = 0.0
        for i, top in enumerate(case["top5_logprobs"]):
            worst = max(worst, abs(lp["token_logprobs"][i] - top[0]["logprob"]))
            got = sorted(lp["top_logprobs"][i].values(), reverse=True)
            check(1 <= len(got) <= 5, f"step {i}: {len(got)} top_logprobs for logprobs=5")
            if len(got) == 5:  # fewer when two tokens share a piece (a dict key)
                worst = max(worst, max(abs(a - t["logprob"]) for a, t in zip(got, top)))
            check(abs(max(got) - lp["token_logprobs"][i]) < 1e-6, f"step {i}: greedy token is not the top-1")
        check(worst < GOLDEN_TOL, f"{case['prompt']!r}: max |logprob - golden| = {worst:g} >= {GOLDEN_TOL}")


# ------------------------------------------------------------------ options

@suite.test
def max_tokens_and_length(ctx):
    for n in (1, 7, 33):
        j = completion(ctx, prompt="Tom had a red ball. He", max_tokens=n, temperature=0, logprobs=0)
        eq(j["choices"][0]["finish_reason"], "length", f"max_tokens={n} finish_reason")
        check_usage(j["usage"], completion_tokens=n, what=f"max_tokens={n} usage")
        eq(len(j["choices"][0]["logprobs"]["tokens"]), n, f"max_tokens={n}: tokens in logprobs")


@suite.test
def default_max_tokens_completions(ctx):
    j = completion(ctx, prompt=GOLD_PROMPT, temperature=0)
    eq(j["usage"]["completion_tokens"], 16, "completion_tokens without max_tokens (OpenAI default 16)")


@suite.test
def stop_strings(ctx):
    gold = ctx.golden["cases"][0]["greedy_text"]
    for stop in ("Lily", ["girl", "little"], [" named", "zzz"], "\n", "irl nam", ["y. She lo", "park"]):
        first = min((gold.find(s) for s in ([stop] if isinstance(stop, str) else stop) if s in gold))
        want = gold[:first]
        j = completion(ctx, prompt=GOLD_PROMPT, max_tokens=200, temperature=0, stop=stop)
        eq(j["choices"][0]["text"], want, f"text with stop={stop!r}")
        eq(j["choices"][0]["finish_reason"], "stop", f"finish_reason with stop={stop!r}")
        s = stream(ctx.port, "/v1/completions", {"prompt": GOLD_PROMPT, "max_tokens": 200, "temperature": 0,
                                                   "stop": stop, "stream": True})
        s.check_well_formed(f"stream with stop={stop!r}")
        eq(s.text(), want, f"streamed text with stop={stop!r}")
        eq(s.finish_reason(), ["stop"], f"streamed finish_reason with stop={stop!r}")
    j = completion(ctx, prompt=GOLD_PROMPT, max_tokens=20, temperature=0, stop=["zzz"])
    eq(j["choices"][0]["finish_reason"], "length", "finish_reason with a stop string that never appears")


@suite.test
def finish_stop_on_eos(ctx):
    # logit_bias makes EOS (id 2) certain: the sequence ends at once with "stop".
    j = completion(ctx, prompt=GOLD_PROMPT, max_tokens=20, temperature=0, logit_bias={"2": 100})
    eq(j["choices"][0]["finish_reason"], "stop", "finish_reason at EOS")
    eq(j["choices"][0]["text"], "", "text at EOS (EOS is not printed)")
    j = chat(ctx, messages=USER_MSG, max_tokens=20, temperature=0, logit_bias={"2": 100})
    eq(j["choices"][0]["finish_reason"], "stop", "chat finish_reason at EOS")
    eq(j["choices"][0]["message"]["content"], "", "chat content at EOS")


@suite.test
def n_choices(ctx):
    j = completion(ctx, prompt="Tom", max_tokens=12, n=3, temperature=1.0, seed=7)
    eq([c["index"] for c in j["choices"]], [0, 1, 2], "choice indexes with n=3")
    check(len({c["text"] for c in j["choices"]}) > 1, f"n=3 at temperature 1 gave 3 identical samples: {j['choices']}")
    check_usage(j["usage"], 3, 36, "n=3 usage (completion tokens summed over choices)")
    s = stream(ctx.port, "/v1/completions", {"prompt": "Tom", "max_tokens": 12, "n": 3, "temperature": 1.0,
                                               "seed": 7, "stream": True, "stream_options": {"include_usage": True}})
    s.check_well_formed("n=3 stream")
    for i in range(3):
        eq(s.text(i), j["choices"][i]["text"], f"streamed choice {i} = non-streamed (same seed)")
        eq(s.finish_reason(i), ["length"], f"streamed choice {i} finish_reason")
    check_usage(s.usage(), 3, 36, "n=3 streamed usage")
    j = chat(ctx, messages=USER_MSG, max_tokens=5, n=2, temperature=1.0, seed=3)
    eq([c["index"] for c in j["choices"]], [0, 1], "chat choice indexes with n=2")
    check_usage(j["usage"], completion_tokens=10, what="chat n=2 usage")


@suite.test
def multiple_prompts(ctx):
    prompts = ["Once upon a time", "The cat sat on the"]
    j = completion(ctx, prompt=prompts, max_tokens=10, temperature=0)
    eq(len(j["choices"]), 2, "choices for 2 prompts")
    for i, p in enumerate(prompts):
        alone = completion(ctx, prompt=p, max_tokens=10, temperature=0)
        eq(j["choices"][i]["index"], i, "index")
        eq(j["choices"][i]["text"], alone["choices"][0]["text"], f"prompt {i} text = alone")
    check_usage(j["usage"], 5 + len(post(ctx.port, "/tokenize", {"prompt": prompts[1]}).json()["tokens"]), 20)


@suite.test
def many_prompts_limit(ctx):
    j = completion(ctx, prompt=[f"Tom {i}" for i in range(64)], max_tokens=2, temperature=0)
    eq(len(j["choices"]), 64, "choices for 64 prompts")
    eq(sorted(c["index"] for c in j["choices"]), list(range(64)), "choice indexes for 64 prompts")
    r = post(ctx.port, "/v1/completions", {"prompt": [f"Tom {i}" for i in range(65)], "max_tokens": 2})
    eq(r.status, 400, f"65 prompts ({short(r.body, 200)})")


@suite.test
def seed_reproducible(ctx):
    body = dict(prompt="Lily and Ben went to the park", max_tokens=40, temperature=1.0, top_p=0.95)
    a = completion(ctx, seed=1234, **body)["choices"][0]["text"]
    b = completion(ctx, seed=1234, **body)["choices"][0]["text"]
    eq(b, a, "same seed, same text")
    s = stream(ctx.port, "/v1/completions", dict(body, seed=1234, stream=True))
    s.check_well_formed()
    eq(s.text(), a, "same seed streamed, same text")
    others = {completion(ctx, seed=sd, **body)["choices"][0]["text"] for sd in (1, 2, 3)}
    check(len(others | {a}) > 1, "four seeds at temperature 1 all gave the same 40 tokens")
    c1 = chat(ctx, messages=USER_MSG, max_tokens=20, temperature=1.0, seed=99)["choices"][0]["message"]["content"]
    c2 = chat(ctx, messages=USER_MSG, max_tokens=20, temperature=1.0, seed=99)["choices"][0]["message"]["content"]
    eq(c2, c1, "chat: same seed, same content")


@suite.test
def echo(ctx):
    plain = completion(ctx, prompt=GOLD_PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    j = completion(ctx, prompt=GOLD_PROMPT, max_tokens=6, temperature=0, echo=True)
    eq(j["choices"][0]["text"], GOLD_PROMPT + plain, "echo: prompt + completion")
    check_usage(j["usage"], 5, 6, "echo usage")
    s = stream(ctx.port, "/v1/completions", {"prompt": GOLD_PROMPT, "max_tokens": 6, "temperature": 0,
                                               "echo": True, "stream": True})
    s.check_well_formed("echo stream")
    eq(s.text(), GOLD_PROMPT + plain, "echo stream: prompt + completion")


def check_text_offsets(text, lp, what):
    toks, offs = lp["tokens"], lp["text_offset"]
    eq(len(offs), len(toks), f"{what}: len(text_offset)")
    for i, (t, o) in enumerate(zip(toks, offs)):
        check(text[o:o + len(t)] == t,
              f"{what}: text_offset[{i}]={o} but text[{o}:{o + len(t)}]={text[o:o + len(t)]!r} != token {t!r} "
              f"(text {short(text, 120)!r}, offsets {offs[:8]})")


@suite.test
def logprobs_completions(ctx):
    j = completion(ctx, prompt=GOLD_PROMPT, max_tokens=12, temperature=0, logprobs=3)
    ch = j["choices"][0]
    lp = ch["logprobs"]
    eq("".join(lp["tokens"]), ch["text"], "tokens concatenate to text")
    for i, top in enumerate(lp["top_logprobs"]):
        check(1 <= len(top) <= 3, f"step {i}: {len(top)} entries for logprobs=3")
        check(all(v <= 0 for v in top.values()), f"step {i}: positive log-prob {top}")
        check(abs(max(top.values()) - lp["token_logprobs"][i]) < 1e-6, f"step {i}: greedy token not top-1")
    check_text_offsets(ch["text"], lp, "text_offset")
    j0 = completion(ctx, prompt=GOLD_PROMPT, max_tokens=4, temperature=0, logprobs=0)
    lp0 = j0["choices"][0]["logprobs"]
    eq(len(lp0["token_logprobs"]), 4, "logprobs=0 still gives the chosen token's log-prob")
    check(all(len(t) == 0 for t in lp0["top_logprobs"]) or all(t is None for t in lp0["top_logprobs"]),
          f"logprobs=0 should give no alternatives: {lp0['top_logprobs']}")
    eq(completion(ctx, prompt=GOLD_PROMPT, max_tokens=2)["choices"][0]["logprobs"], None, "no logprobs unless asked")
    s = stream(ctx.port, "/v1/completions", {"prompt": GOLD_PROMPT, "max_tokens": 12, "temperature": 0,
                                               "logprobs": 3, "stream": True})
    s.check_well_formed("logprobs stream")
    toks = [t for e in s.events for c in e["choices"] if c.get("logprobs") for t in c["logprobs"]["tokens"]]
    eq(toks, lp["tokens"], "streamed logprobs tokens = non-streamed")
    vals = [v for e in s.events for c in e["choices"] if c.get("logprobs") for v in c["logprobs"]["token_logprobs"]]
    eq(vals, lp["token_logprobs"], "streamed token_logprobs = non-streamed")


@suite.test
def default_max_tokens_fits_the_context(ctx):
    # OpenAI's default of 16 new tokens, capped by what a long prompt leaves of the context (found by
    # fuzz_openai_request: a prompt 8 tokens short of the context used to be accepted with 16 to generate).
    n_ctx = get(ctx.port, "/v1/models").json()["data"][0]["max_model_len"]
    prompt = [1] + [403] * (n_ctx - 9)
    j = completion(ctx, prompt=prompt, temperature=0, ignore_eos=True)
    eq(j["usage"]["completion_tokens"], 8, "generated up to the end of the context")
    eq(j["choices"][0]["finish_reason"], "length", "finish_reason")
    eq(completion(ctx, prompt=[1, 403], temperature=0, ignore_eos=True)["usage"]["completion_tokens"], 16,
       "the default is 16 otherwise")


@suite.test
def logprobs_echo_offsets(ctx):
    # With echo the returned text starts with the prompt, so text_offset must count it.
    j = completion(ctx, prompt=GOLD_PROMPT, max_tokens=5, temperature=0, logprobs=1, echo=True)
    ch = j["choices"][0]
    check(ch["text"].startswith(GOLD_PROMPT), "echo text starts with the prompt")
    check_text_offsets(ch["text"], ch["logprobs"], "echo + logprobs text_offset")


@suite.test
def logprobs_chat(ctx):
    j = chat(ctx, messages=USER_MSG, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3)
    ch = j["choices"][0]
    content = ch["logprobs"]["content"]
    eq(len(content), 10, "chat logprobs.content entries = completion tokens")
    eq("".join(e["token"] for e in content), ch["message"]["content"], "chat logprob tokens concatenate to content")
    for i, e in enumerate(content):
        eq(set(e), {"token", "logprob", "bytes", "top_logprobs"}, f"content[{i}] keys")
        eq(e["bytes"], list(e["token"].encode()), f"content[{i}].bytes")
        eq(len(e["top_logprobs"]), 3, f"content[{i}].top_logprobs length")
        vals = [t["logprob"] for t in e["top_logprobs"]]
        eq(vals, sorted(vals, reverse=True), f"content[{i}].top_logprobs sorted")
        check(abs(vals[0] - e["logprob"]) < 1e-6, f"content[{i}]: greedy token not top-1")
    j = chat(ctx, messages=USER_MSG, max_tokens=3, temperature=0, logprobs=True)
    for e in j["choices"][0]["logprobs"]["content"]:
        eq(e["top_logprobs"], [], "logprobs without top_logprobs: empty top_logprobs")
    eq(chat(ctx, messages=USER_MSG, max_tokens=2)["choices"][0].get("logprobs"), None, "no chat logprobs unless asked")


# ------------------------------------------------------------------ chat

@suite.test
def chat_non_streaming(ctx):
    j = chat(ctx, model=MODEL_ID, messages=[{"role": "system", "content": "You tell stories."}] + USER_MSG,
             max_tokens=12, temperature=0)
    eq(j["object"], "chat.completion", "object")
    check(j["id"].startswith("chatcmpl"), f"id {j['id']}")
    eq(j["model"], MODEL_ID, "model")
    ch = j["choices"][0]
    eq(ch["index"], 0, "index")
    eq(ch["message"]["role"], "assistant", "role")
    check(isinstance(ch["message"]["content"], str) and ch["message"]["content"], "content is a non-empty string")
    eq(ch["finish_reason"], "length", "finish_reason")
    check_usage(j["usage"], completion_tokens=12)
    j2 = chat(ctx, messages=[{"role": "user", "content": [{"type": "text", "text": USER_MSG[0]["content"]}]}],
              max_tokens=12, temperature=0)
    j3 = chat(ctx, messages=USER_MSG, max_tokens=12, temperature=0)
    eq(j2["choices"][0]["message"]["content"], j3["choices"][0]["message"]["content"],
       "content as [{type: text}] parts = the same content as a string")
    j4 = chat(ctx, messages=USER_MSG, max_completion_tokens=4, temperature=0)
    eq(j4["usage"]["completion_tokens"], 4, "max_completion_tokens")


@suite.test
def chat_streaming(ctx):
    plain = chat(ctx, messages=USER_MSG, max_tokens=30, temperature=0)
    s = stream(ctx.port, "/v1/chat/completions", {"messages": USER_MSG, "max_tokens": 30, "temperature": 0,
                                                    "stream": True, "stream_options": {"include_usage": True}})
    s.check_well_formed("chat stream")
    eq({e["object"] for e in s.events}, {"chat.completion.chunk"}, "chunk object")
    eq(len({e["id"] for e in s.events}), 1, "one id for all chunks")
    first = s.events[0]["choices"][0]["delta"]
    eq(first.get("role"), "assistant", "first delta has role: assistant")
    eq(s.text(chat=True), plain["choices"][0]["message"]["content"], "streamed content = non-streamed")
    eq(s.finish_reason(), ["length"], "finish_reason (exactly once)")
    eq(s.events[-1]["choices"], [], "usage chunk has choices: []")
    check_usage(s.usage(), plain["usage"]["prompt_tokens"], 30, "streamed chat usage")
    s = stream(ctx.port, "/v1/chat/completions", {"messages": USER_MSG, "max_tokens": 5, "stream": True})
    s.check_well_formed("chat stream without include_usage")
    check(all("usage" not in e or e["usage"] is None for e in s.events), "usage sent without include_usage")


@suite.test
def keep_alive_connection(ctx):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", ctx.port, timeout=30)
    try:
        texts = []
        for _ in range(3):
            conn.request("POST", "/v1/completions", body=json.dumps({"prompt": GOLD_PROMPT, "max_tokens": 4,
                                                                      "temperature": 0}),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            eq(r.status, 200, "status on a kept-alive connection")
            texts.append(json.loads(r.read())["choices"][0]["text"])
        conn.request("GET", "/health")
        r = conn.getresponse()
        eq(r.status, 200, "GET /health on the same connection")
        r.read()
        eq(len(set(texts)), 1, "same greedy text on each request")
    finally:
        conn.close()


@suite.test
def pipelined_requests(ctx):
    # Two requests in one write on one connection: two answers, in order.
    body = json.dumps({"prompt": GOLD_PROMPT, "max_tokens": 10, "temperature": 0}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    data = req + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + req.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n", 1)
    s = socket.create_connection(("127.0.0.1", ctx.port), timeout=10)
    try:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    finally:
        s.close()
    answers = []
    while out:
        r = parse_raw_response(out)
        answers.append(r)
        head_len = out.index(b"\r\n\r\n") + 4
        out = out[head_len + len(r.body):]
    eq([r.status for r in answers], [200, 200, 200], f"statuses of 3 pipelined requests ({answers})")
    eq(answers[0].json()["choices"][0]["text"], ", there was a little girl named Lily", "first answer")
    eq(answers[1].json().get("status"), "ok", "second answer (/health)")
    eq(answers[2].json()["choices"][0]["text"], ", there was a little girl named Lily", "third answer")


@suite.test
def chunked_request_body(ctx):
    body = json.dumps({"prompt": GOLD_PROMPT, "max_tokens": 10, "temperature": 0}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7))
    data = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunks + b"0\r\n\r\n")
    r = parse_raw_response(raw_exchange(ctx.port, data))
    check(r is not None, "no answer to a chunked request")
    eq(r.status, 200, f"chunked request body ({r})")
    eq(r.json()["choices"][0]["text"], ", there was a little girl named Lily", "text")


@suite.test
def expect_100_continue(ctx):
    # curl sends "Expect: 100-continue" for bodies over 1 MB and then waits 1 s
    # for "100 Continue" before sending the body anyway; other clients wait longer.
    body = json.dumps({"prompt": GOLD_PROMPT, "max_tokens": 10, "temperature": 0}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
    s = socket.create_connection(("127.0.0.1", ctx.port), timeout=10)
    try:
        s.sendall(head)
        s.settimeout(1.0)
        try:
            interim = s.recv(4096)
        except socket.timeout:
            interim = b""
        s.sendall(body)
        s.settimeout(10)
        rest = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    finally:
        s.close()
    check(interim.startswith(b"HTTP/1.1 100"),
          f"no '100 Continue' within 1 s of headers with 'Expect: 100-continue' (got {interim[:80]!r}): "
          f"clients such as curl (bodies > 1 MB) stall 1 s per request")
    final = rest if not interim.startswith(b"HTTP/1.1 100") else (interim.split(b"\r\n\r\n", 1)[1] + rest)
    r = parse_raw_response(final)
    eq(r.status if r else None, 200, "final status after 100 Continue")


@suite.test
def query_string_and_unicode(ctx):
    eq(get(ctx.port, "/v1/models?limit=5").status, 200, "GET /v1/models?limit=5")
    text = "Héllo wörld — 日本語 🙂 \u00a0end"
    t = post(ctx.port, "/tokenize", {"prompt": text, "add_special": False}).json()
    d = post(ctx.port, "/detokenize", {"tokens": t["tokens"]}).json()
    eq(d["prompt"], text, "tokenize/detokenize round trip of non-ASCII text (byte fallback, no BOS)")
    j = completion(ctx, prompt=text, max_tokens=5, temperature=0, echo=True)
    check(j["choices"][0]["text"].startswith(text), f"echo of a non-ASCII prompt: {j['choices'][0]['text']!r}")
    j = chat(ctx, messages=[{"role": "user", "content": text}], max_tokens=5)
    eq(j["usage"]["completion_tokens"], 5, "chat with a non-ASCII message")


if __name__ == "__main__":
    raise SystemExit(suite.main())
