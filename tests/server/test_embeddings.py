#!/usr/bin/env python3
"""/v1/embeddings and /v1/rerank end to end: synthetic bert / nomic-bert files
(written by `serval gguf synth` with the BERT vocab of ../shared), a bert
reranker, and stories260K served with --pooling last. Checks the OpenAI
shapes (float and base64, token-id inputs, dimensions), that a batched input
equals the same input alone (bit for bit), rerank ordering and top_n, that
generation and embeddings work side by side, and the 400s of bad input."""

import base64
import contextlib
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Config, Server, Suite, check, check_error_body, eq, metric, post, run_threads  # noqa: E402

suite = Suite("server_embeddings")
E = "/v1/embeddings"
R = "/v1/rerank"
MAX_INPUTS = 8


def synth(out_dir, name, *args):
    path = os.path.join(out_dir, name + ".gguf")
    vocab = os.path.join(Config.shared, "tokenizer-vectors", "ggml-vocab-bert-bge.gguf")
    subprocess.run([Config.serval, "gguf", "synth", "--shape", "bert-tiny", "--vocab", vocab, "-o", path, "-t", "1",
                    *args], check=True, capture_output=True)
    return path


@suite.setup
@contextlib.contextmanager
def setup():
    tmp = tempfile.mkdtemp(prefix="serval-embed-test-")
    try:
        bert = synth(tmp, "bert", "--type", "f16")
        nomic = synth(tmp, "nomic", "--arch", "nomic-bert", "--type", "f16")
        rank = synth(tmp, "rank", "--type", "f32", "--pooling", "rank")
        servers = {
            "bert": Server("--max-embed-inputs", str(MAX_INPUTS), name="embed-bert", model=bert, chat_template=False),
            "nomic": Server(name="embed-nomic", model=nomic, chat_template=False),
            "rank": Server(name="embed-rank", model=rank, chat_template=False),
            "gen": Server("--pooling", "last", name="embed-gen"),
            "plain": Server(name="embed-plain"),
        }
        with contextlib.ExitStack() as st:
            for s in servers.values():
                st.enter_context(s)
            ports = {k: s.port for k, s in servers.items()}
            ports["bert_path"] = bert
            yield ports
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def embed(port, body, status=200):
    r = post(port, E, body)
    eq(r.status, status, f"status ({r.body[:300]!r})")
    return r.json()


def norm(v):
    return math.sqrt(sum(x * x for x in v))


TEXTS = ["the cat sat on the mat", "a completely different sentence about databases",
         "short", "hello world, this is a test of the embedding route"]


@suite.test
def shapes_and_unit_norm(ports):
    for name in ("bert", "nomic"):
        j = embed(ports[name], {"input": TEXTS[0], "model": None})
        eq(j["object"], "list", "object")
        eq(len(j["data"]), 1, "one embedding")
        d = j["data"][0]
        eq(d["object"], "embedding", "item object")
        eq(d["index"], 0, "index")
        eq(len(d["embedding"]), 128, f"{name}: dimensions")
        check(abs(norm(d["embedding"]) - 1.0) < 1e-5, f"{name}: L2-normalized, got {norm(d['embedding'])}")
        eq(j["usage"]["prompt_tokens"], 8, f"{name}: [CLS] + 6 words + [SEP]")
        eq(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"], "total tokens")


@suite.test
def batched_equals_alone(ports):
    for name in ("bert", "nomic", "gen"):
        j = embed(ports[name], {"input": TEXTS})
        eq([d["index"] for d in j["data"]], list(range(len(TEXTS))), "indices in order")
        for i, t in enumerate(TEXTS):
            one = embed(ports[name], {"input": [t]})["data"][0]["embedding"]
            eq(j["data"][i]["embedding"], one, f"{name}: input {i} batched vs alone")
        check(j["data"][0]["embedding"] != j["data"][1]["embedding"], f"{name}: different texts, different embeddings")


@suite.test
def concurrent_clients_get_what_they_get_alone(ports):
    p = ports["bert"]
    alone = [embed(p, {"input": t})["data"][0]["embedding"] for t in TEXTS]
    before = metric(p, "serval_embedding_inputs_total")
    res = run_threads([lambda t=t: post(p, E, {"input": [t] * 3}) for t in TEXTS * 3])
    for k, r in enumerate(res):
        check(not isinstance(r, Exception), f"client {k}: {r!r}")
        eq(r.status, 200, f"client {k} status")
        for d in r.json()["data"]:
            eq(d["embedding"], alone[k % len(TEXTS)], f"client {k}")
    eq(metric(p, "serval_embedding_inputs_total") - before, 3 * 3 * len(TEXTS), "inputs counted")


@suite.test
def token_ids_base64_and_dimensions(ports):
    p = ports["bert"]
    text = embed(p, {"input": TEXTS[3]})["data"][0]["embedding"]
    ids = post(p, "/tokenize", {"prompt": TEXTS[3]}).json()["tokens"]
    eq(ids[0], 101, "[CLS] first")
    eq(ids[-1], 102, "[SEP] last")
    eq(embed(p, {"input": ids})["data"][0]["embedding"], text, "token ids = the text")
    both = embed(p, {"input": [ids, TEXTS[3]]})["data"]
    eq(both[0]["embedding"], both[1]["embedding"], "token ids and text in one request")
    b64 = embed(p, {"input": TEXTS[3], "encoding_format": "base64"})["data"][0]["embedding"]
    check(isinstance(b64, str), "base64: a string")
    raw = base64.b64decode(b64)
    eq(len(raw), 128 * 4, "base64: 128 float32")
    floats = list(struct.unpack("<128f", raw))
    check(max(abs(a - b) for a, b in zip(floats, text)) < 1e-7, "base64 decodes to the float embedding")
    short = embed(p, {"input": TEXTS[3], "dimensions": 32})["data"][0]["embedding"]
    eq(len(short), 32, "dimensions: 32")
    n = norm(text[:32])
    check(max(abs(a - b / n) for a, b in zip(short, text[:32])) < 1e-6, "dimensions: the first 32, renormalized")


@suite.test
def rerank_orders_and_cuts(ports):
    p = ports["rank"]
    docs = ["the cat sat on the mat", "databases index rows", "a cat and a mat", "rain in spain", "cats"]
    r = post(p, R, {"query": "where did the cat sit?", "documents": docs})
    eq(r.status, 200, f"status ({r.body[:300]!r})")
    j = r.json()
    res = j["results"]
    eq(sorted(x["index"] for x in res), list(range(len(docs))), "every document scored")
    scores = [x["relevance_score"] for x in res]
    eq(scores, sorted(scores, reverse=True), "best first")
    check(len(set(scores)) == len(scores), f"scores differ by document: {scores}")
    check(j["usage"]["prompt_tokens"] > 0, "usage")
    # Each document alone gets the score it got among the others.
    by_index = {x["index"]: x["relevance_score"] for x in res}
    for i, d in enumerate(docs):
        one = post(p, R, {"query": "where did the cat sit?", "documents": [{"text": d}]}).json()["results"][0]
        eq(one["relevance_score"], by_index[i], f"document {i} alone")
    top = post(p, "/rerank", {"query": "where did the cat sit?", "documents": docs, "top_n": 2,
                              "return_documents": True}).json()["results"]
    eq(len(top), 2, "top_n")
    eq([x["index"] for x in top], [x["index"] for x in res[:2]], "top_n keeps the best")
    eq(top[0]["document"]["text"], docs[top[0]["index"]], "return_documents")
    check("document" not in res[0], "documents not returned by default")


@suite.test
def generation_and_embeddings_side_by_side(ports):
    p = ports["gen"]
    e = embed(p, {"input": ["Once upon a time", "The little dog"]})
    eq(len(e["data"][0]["embedding"]), 64, "stories260K: 64 dimensions")
    r = post(p, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    eq(r.status, 200, "completion still served")
    check(len(r.json()["choices"][0]["text"]) > 0, "generated text")


@suite.test
def bad_requests_name_the_field(ports):
    p = ports["bert"]
    cases = [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({}, "input"),
        ({"input": 5}, "input"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": ["ok", {"a": 1}]}, "input[1]"),
        ({"input": ["x"] * (MAX_INPUTS + 1)}, "input"),
        ({"input": " ".join(["word"] * 300)}, "input[0]"),  # past the 128 positions
        ({"input": [[101, 999999]]}, "input[0]"),
        ({"input": [101, -1]}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 129}, "dimensions"),
        ({"input": "x", "user": 5}, "user"),
    ]
    for body, param in cases:
        r = post(p, E, body)
        check_error_body(r, 400, f"{body!r:.80}", param=param)
    check_error_body(post(p, E, {"input": "x", "model": "nope"}), 404, "unknown model", param="model")
    check_error_body(post(p, E, "not json"), 400, "not JSON")
    # Each model only on its own routes.
    check_error_body(post(p, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}), 400,
                     "chat on an embedding model", param="model")
    check_error_body(post(p, "/v1/completions", {"prompt": "hi"}), 400, "completion on an embedding model",
                     param="model")
    check_error_body(post(p, R, {"query": "q", "documents": ["d"]}), 400, "rerank on an embedding model",
                     param="model")
    check_error_body(post(ports["plain"], E, {"input": "hi"}), 400, "embeddings on a generation model",
                     param="model")
    check_error_body(post(ports["rank"], E, {"input": "hi"}), 400, "embeddings on a reranker", param="model")
    for body, param in [({"documents": ["d"]}, "query"), ({"query": "q"}, "documents"),
                        ({"query": "q", "documents": []}, "documents"), ({"query": "q", "documents": [3]}, "documents[0]"),
                        ({"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
                        ({"query": "q", "documents": ["d"] * (2049)}, "documents"),
                        ({"query": "q", "documents": ["d", " ".join(["word"] * 300)]}, "documents[1]"),
                        ({"query": " ".join(["word"] * 126), "documents": ["d"]}, "query"),
                        ({"query": " ".join(["word"] * 100), "documents": ["d", " ".join(["word"] * 30)]}, "documents[1]")]:
        check_error_body(post(ports["rank"], R, body), 400, f"rerank {body!r:.60}", param=param)
    # The server is unharmed.
    eq(post(p, E, {"input": "still fine"}).status, 200, "still serving")


@suite.test
def generation_commands_refuse_an_encoder(ports):
    m = ports["bert_path"]
    for args in (["run", "-m", m, "-p", "hello", "-n", "4"], ["bench", "model", "-m", m, "-p", "8", "-n", "4", "-r", "1"],
                 ["chat", "-m", m]):
        p = subprocess.run([Config.serval, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        eq(p.returncode, 2, f"serval {args[0]}: exit status ({p.stderr[-300:]!r})")
        check("is an embedding model (bert)" in p.stderr, f"serval {args[0]}: says why ({p.stderr[-300:]!r})")


if __name__ == "__main__":
    suite.main()
