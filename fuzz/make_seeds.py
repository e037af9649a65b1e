#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses into fuzz/corpus/<harness>/.
Deterministic; run it again after changing a seed and commit the result.
GGUF seeds are tiny llama models (dim 8, 1 layer) written from the format
spec, so the fuzzer starts from files that pass the reader, the tokenizer and
the model loader and mutates from there."""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")

U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == U32:
        return struct.pack("<I", v)
    if t == I32:
        return struct.pack("<i", v)
    if t == F32:
        return struct.pack("<f", v)
    if t == BOOL:
        return struct.pack("<B", v)
    if t == STR:
        return gstr(v)
    if t == U64:
        return struct.pack("<Q", v)
    raise ValueError(t)


def kv(key, t, v, elem=None):
    out = gstr(key) + struct.pack("<I", t)
    if t == ARR:
        out += struct.pack("<IQ", elem, len(v)) + b"".join(value(elem, x) for x in v)
    else:
        out += value(t, v)
    return out


def gguf(kvs, tensors, version=3, align=32):
    """tensors: [(name, dims, f32 values)]"""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    infos, data = b"", b""
    for name, dims, vals in tensors:
        data += b"\0" * (-len(data) % align)
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", 0, len(data))  # type f32, offset
        data += struct.pack(f"<{len(vals)}f", *vals)
    body = head + infos
    body += b"\0" * (-len(body) % align)
    return body + data


def vocab_kvs(tokens):
    return [
        kv("tokenizer.ggml.model", STR, "llama"),
        kv("tokenizer.ggml.tokens", ARR, tokens, STR),
        kv("tokenizer.ggml.scores", ARR, [-float(i) for i in range(len(tokens))], F32),
        kv("tokenizer.ggml.token_type", ARR, [2, 3, 3] + [6] * 3 + [1] * (len(tokens) - 6), I32),
        kv("tokenizer.ggml.bos_token_id", U32, 1),
        kv("tokenizer.ggml.eos_token_id", U32, 2),
    ]


def tiny_llama(tied=True, n_kv_heads=2):
    dim, ffn, heads, n_vocab = 8, 16, 2, 10
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "<0x20>", "<0xFF>", "\u2581a", "b", "\u2581ab", "\u2581"]
    kvs = [kv("general.architecture", STR, "llama"), kv("llama.embedding_length", U32, dim),
           kv("llama.block_count", U32, 1), kv("llama.attention.head_count", U32, heads),
           kv("llama.attention.head_count_kv", U32, n_kv_heads), kv("llama.feed_forward_length", U32, ffn),
           kv("llama.context_length", U32, 64), kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
           kv("tokenizer.chat_template", STR, "{% for m in messages %}{{ m.content }}{% endfor %}")]
    kvs += vocab_kvs(tokens)
    kv_dim = dim // heads * n_kv_heads

    def t(name, *dims):
        n = 1
        for d in dims:
            n *= d
        return (name, list(dims), [((i * 7) % 13 - 6) / 10 for i in range(n)])

    tensors = [t("token_embd.weight", dim, n_vocab), t("output_norm.weight", dim),
               t("blk.0.attn_norm.weight", dim), t("blk.0.attn_q.weight", dim, dim),
               t("blk.0.attn_k.weight", dim, kv_dim), t("blk.0.attn_v.weight", dim, kv_dim),
               t("blk.0.attn_output.weight", dim, dim), t("blk.0.ffn_norm.weight", dim),
               t("blk.0.ffn_gate.weight", dim, ffn), t("blk.0.ffn_up.weight", dim, ffn),
               t("blk.0.ffn_down.weight", ffn, dim)]
    if not tied:
        tensors.append(t("output.weight", dim, n_vocab))
    return gguf(kvs, tensors)


def lora_for_stories():
    """A rank-2 LoRA adapter on stories260K's (the fuzz base's) blk.0 attn_q and attn_v."""
    kvs = [kv("general.architecture", STR, "llama"), kv("general.type", STR, "adapter"),
           kv("adapter.type", STR, "lora"), kv("adapter.lora.alpha", F32, 4.0)]

    def t(name, *dims):
        n = dims[0] * dims[1]
        return (name, list(dims), [((i * 5) % 11 - 5) / 50 for i in range(n)])

    tensors = [t("blk.0.attn_q.weight.lora_a", 64, 2), t("blk.0.attn_q.weight.lora_b", 2, 64),
               t("blk.0.attn_v.weight.lora_a", 64, 2), t("blk.0.attn_v.weight.lora_b", 2, 32)]
    return gguf(kvs, tensors)


def write(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    write("gguf", "tiny_llama_tied.gguf", tiny_llama())
    write("gguf", "tiny_llama_gqa_untied.gguf", tiny_llama(tied=False, n_kv_heads=1))
    write("gguf", "vocab_only.gguf", gguf(vocab_kvs(["<unk>", "<s>", "</s>", "<0x41>", "<0x42>", "<0x43>", "x"]), []))
    write("gguf", "version2_empty.gguf", gguf([], [], version=2))
    write("gguf", "lora_stories.gguf", lora_for_stories())

    for i, s in enumerate(["Once upon a time, there was a little girl named Lily.",
                           "  leading spaces\nand\ttabs\r\n", "caf\u00e9 \u65e5\u672c\u8a9e \U0001F600",
                           "<s>special</s> <unk>", "\xff\xfe bytes", "a" * 300, ""]):
        write("tokenizer", f"seed{i}", s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s)
    write("tokenizer", "invalid_utf8", b"ab\xc3\x28\xe2\x82\xf0\x9f\x98 \xed\xa0\x80")

    # (scripts/fuzz.sh also seeds from ../shared/chat-templates, the real templates.)
    write("chat_template", "phi3.jinja",
          "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
          "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}"
          "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")
    write("chat_template", "macro_recursion.jinja",
          "{% macro f(n) %}{{ n }}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}")
    write("chat_template", "filters.jinja",
          "{{ messages | map(attribute='role') | join(',') | upper }}{{ tools | tojson(indent=2) }}"
          "{% set ns = namespace(x=0) %}{% for i in range(3) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"
          "{{ 'a,b'.split(',') }}{{ raise_exception('x') if false }}{{ strftime_now('%Y') }}")

    bodies = [
        (0, {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}),
        (0, {"prompt": [1, 403, 407], "n": 2, "logprobs": 3, "echo": True, "stop": ["\n", "."],
             "logit_bias": {"5": -100}, "seed": 7, "stream": True, "stream_options": {"include_usage": True}}),
        (0, {"prompt": ["a", [1, 2]], "max_tokens": 3, "top_p": 0.9, "top_k": 40, "stop_token_ids": [2]}),
        (1, {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
             "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 2, "model": "stories260K"}),
        (1, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
             "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
             "presence_penalty": 0.5, "frequency_penalty": -0.5}),
    ]
    bodies += [
        (0, {"prompt": "x", "temperature": 1e300, "logit_bias": {"5": -1e300}}),  # past float range
        (1, {"messages": [{"role": "user", "content": "{{ 7 * 7 }}"}], "chat_template": "{{ 1 }}",
             "chat_template_kwargs": {"enable_thinking": True}}),
    ]
    for i, (chat, body) in enumerate(bodies):
        write("openai_request", f"body{i}", bytes([chat]) + json.dumps(body).encode())
    write("openai_request", "nested", b"\0" + b'{"prompt": "x", "user": ' + b"[" * 70 + b"]" * 70 + b"}")
    for i, (chat, body) in enumerate(bodies[:4]):
        b = json.dumps(body).encode()
        path = "/v1/chat/completions" if chat else "/v1/completions"
        write("http_request", f"post{i}", f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(b)}\r\n\r\n".encode() + b)
    b = json.dumps(bodies[0][1]).encode()
    write("http_request", "chunked_pipelined",
          b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
          + b"%x\r\n" % len(b) + b + b"\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    write("http_request", "get_auth", b"GET /v1/models?x=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
          b"Expect: 100-continue\r\nConnection: keep-alive\r\n\r\n")
    # gateway: requests to serval gateway (one model 'm', alias 'a', a key, an admin key).
    def req(method, path, body=None, key=None):
        b = json.dumps(body).encode() if body is not None else b""
        h = f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
        if key:
            h += f"Authorization: Bearer {key}\r\n"
        if body is not None:
            h += f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\n"
        return h.encode() + b"\r\n" + b
    user, admin = "user-key-0123456789", "admin-key-0123456789"
    write("gateway", "completion", req("POST", "/v1/completions", {"model": "m", "prompt": "Once", "max_tokens": 3}, user))
    write("gateway", "chat_stream", req("POST", "/v1/chat/completions", {
        "model": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": True,
        "stream_options": {"include_usage": True}}, user))
    write("gateway", "embeddings", req("POST", "/v1/embeddings", {"model": "n", "input": [1, 2, 3]}))
    write("gateway", "make_key", req("POST", "/v1/gateway/keys", {"name": "x", "rpm": 5, "models": ["m"],
                                                                   "budget": 2, "budget_period": "month"}, admin))
    write("gateway", "usage_and_delete", req("GET", "/v1/gateway/usage?key=k&from=2026-01-01&to=2026-12-31", key=admin)
          + req("DELETE", "/v1/gateway/keys/x", key=admin) + req("GET", "/v1/gateway/keys", key=admin)
          + req("GET", "/v1/models"))
    write("gateway", "probes", req("GET", "/health") + req("GET", "/ready") + req("GET", "/metrics"))
    write("gateway", "anthropic_and_responses", req("POST", "/v1/messages", {
        "model": "m", "max_tokens": 3, "system": [{"type": "text", "text": "s"}], "stream": True,
        "messages": [{"role": "user", "content": "hi"}]}, user)
          + req("POST", "/v1/responses", {"model": "a", "instructions": "x", "input": [{"role": "user", "content": "hi"}]}, user))
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})
    chat = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": "hi"}]}})
    write("batch_input", "lines", line + "\n" + chat + "\n\n{broken\n" + line + "\n")
    write("batch_input", "multipart",
          '--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
          '--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
          'Content-Type: application/jsonl\r\n\r\n' + line + "\n" + chat + '\r\n--b--\r\n')
    # api_translation: first byte = path (0 Anthropic request, 1 Responses
    # request, 2/3 translators: Anthropic/Responses; bit 2 = count_tokens,
    # owner, or a whole body; bit 3 = an error status).
    msg = {"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "s"}], "stop_sequences": ["x"],
           "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"},
           "messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}]}
    write("api_translation", "messages", b"\0" + json.dumps(msg).encode())
    write("api_translation", "count_tokens", b"\4" + json.dumps({"model": "m", "messages": msg["messages"]}).encode())
    resp = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "r"}],
            "instructions": "i", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
            "max_output_tokens": 9, "previous_response_id": None, "metadata": {"k": "v"}}
    write("api_translation", "responses", b"\1" + json.dumps(resp).encode())
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"reasoning_content": "r"}}]},
              {"choices": [{"index": 0, "delta": {"content": "a"}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{"}}]}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "x"}]},
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}}},
              {"error": {"message": "m", "type": "server_error", "param": None, "code": None}}]
    stream = "\n".join(json.dumps(c) for c in chunks).encode()
    # embeddings_api: first byte even = /v1/embeddings, odd = /v1/rerank.
    write("embeddings_api", "strings", b"\0" + json.dumps({"input": ["hello there", "x"], "encoding_format": "base64",
                                                            "dimensions": 4, "model": "stories260K"}).encode())
    write("embeddings_api", "token_ids", b"\0" + json.dumps({"input": [[1, 2, 3], [4]], "user": "u"}).encode())
    write("embeddings_api", "rerank", b"\1" + json.dumps({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1,
                                                          "return_documents": True}).encode())
    write("api_translation", "anthropic_stream", b"\2" + stream)
    write("api_translation", "responses_stream", b"\3" + stream)
    whole = {"model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "a", "reasoning_content": "r",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    write("api_translation", "anthropic_whole", b"\6" + json.dumps(whole).encode())
    write("api_translation", "responses_whole", b"\7" + json.dumps(whole).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
