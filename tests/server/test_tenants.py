#!/usr/bin/env python3
"""Tenant isolation of the prefix cache: by default each API key has its own
cache namespace (Request::tenant_salt), so a tenant cannot tell from
usage.prompt_tokens_details.cached_tokens (or from latency) that another
tenant sent a prompt; --shared-prefix-cache shares one namespace."""

import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from harness import Server, Suite, check, eq, post  # noqa: E402

suite = Suite("server_tenants")
C = "/v1/completions"
KEYS = ["tenant-a-key", "tenant-b-key"]
# Long enough to fill several 16-token KV blocks.
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
          "One day, she saw a big red ball in the park and ran to get it.")


def cached(port, key, prompt=PROMPT):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = post(port, C, {"prompt": prompt, "max_tokens": 1, "temperature": 0}, headers=headers)
    eq(r.status, 200, f"completion with key {key!r}")
    u = r.json()["usage"]
    return u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]


@suite.test
def salted_per_api_key_by_default(_):
    with Server("--api-key", KEYS[0], "--api-key", KEYS[1], name="tenants") as srv:
        n, first = cached(srv.port, KEYS[0])
        eq(first, 0, "cached tokens of the first request")
        check(n >= 32, f"the prompt has only {n} tokens; too short to span KV blocks")
        _, again = cached(srv.port, KEYS[0])
        check(again >= 16, f"the same tenant's repeat got {again} cached tokens (prefix caching is on)")
        _, other = cached(srv.port, KEYS[1])
        eq(other, 0, "cached tokens of another tenant's identical prompt (must not hit tenant A's cache)")
        _, other_again = cached(srv.port, KEYS[1])
        check(other_again >= 16, f"tenant B's own repeat got {other_again} cached tokens")
        # A prefix of A's prompt under B: nothing from A either (B now has its own copy, so use a new text).
        _, fresh = cached(srv.port, KEYS[1], PROMPT.replace("Lily", "Mia"))
        eq(fresh, 0, "a fresh prompt for tenant B")


@suite.test
def shared_when_configured(_):
    with Server("--api-key", KEYS[0], "--api-key", KEYS[1], "--shared-prefix-cache", name="tenants-shared") as srv:
        eq(cached(srv.port, KEYS[0])[1], 0, "cached tokens of the first request")
        _, other = cached(srv.port, KEYS[1])
        check(other >= 16, f"--shared-prefix-cache: tenant B got {other} cached tokens for tenant A's prompt")


@suite.test
def no_keys_one_namespace(_):
    with Server(name="tenants-nokey") as srv:
        eq(cached(srv.port, None)[1], 0, "cached tokens of the first request")
        check(cached(srv.port, None)[1] >= 16, "without API keys all requests share one prefix cache")


if __name__ == "__main__":
    raise SystemExit(suite.main())
