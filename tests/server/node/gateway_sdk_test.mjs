// The official OpenAI Node SDK through `serval gateway` (in front of serval
// serve replicas). Run by tests/server/run_node_test.py, which passes:
//   SERVAL_GATEWAY_URL     http://127.0.0.1:PORT/v1 (the gateway)
//   SERVAL_BASE_URL        http://127.0.0.1:PORT/v1 (one replica, to compare with)
//   SERVAL_API_KEY         the replicas' key
//   SERVAL_GATEWAY_KEY     a virtual key of the gateway (budget-limited)
//   SERVAL_GATEWAY_ADMIN   the gateway's admin key
//   SERVAL_MODEL_ID        the model name (the same at the gateway and the replica)
//   SERVAL_EMBED_MODEL_ID  an embedding model routed by the gateway
//   SERVAL_GOLDEN          ../shared/golden/stories260K-greedy.json
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { run, test } from './runner.mjs';

const model = process.env.SERVAL_MODEL_ID;
const golden = JSON.parse(readFileSync(process.env.SERVAL_GOLDEN, 'utf8'));
const gold = golden.cases[0];
const gw = new OpenAI({ baseURL: process.env.SERVAL_GATEWAY_URL, apiKey: process.env.SERVAL_GATEWAY_KEY, maxRetries: 0, timeout: 60_000 });
const direct = new OpenAI({ baseURL: process.env.SERVAL_BASE_URL, apiKey: process.env.SERVAL_API_KEY, maxRetries: 0, timeout: 60_000 });
const MSGS = [{ role: 'user', content: 'Tell me a story about a cat.' }];
const root = (u) => u.replace(/\/v1$/, '');
const anth = new Anthropic({ baseURL: root(process.env.SERVAL_GATEWAY_URL), apiKey: process.env.SERVAL_GATEWAY_KEY, maxRetries: 0 });
const anthDirect = new Anthropic({ baseURL: root(process.env.SERVAL_BASE_URL), apiKey: process.env.SERVAL_API_KEY, maxRetries: 0 });

async function usageTotals() {
  const r = await fetch(`${process.env.SERVAL_GATEWAY_URL}/gateway/usage?key=sdk`,
    { headers: { Authorization: `Bearer ${process.env.SERVAL_GATEWAY_ADMIN}` } });
  return (await r.json()).total;
}
const settle = () => new Promise((res) => setTimeout(res, 80));

test('models.list through the gateway', async () => {
  const ids = [];
  for await (const m of gw.models.list()) ids.push(m.id);
  assert.ok(ids.includes(model), `no ${model} in ${ids}`);
  assert.ok(ids.includes(process.env.SERVAL_EMBED_MODEL_ID));
});

test('completions: greedy text equals the golden (llama.cpp), non-streaming', async () => {
  const r = await gw.completions.create({ model, prompt: gold.prompt, max_tokens: 200, temperature: 0 });
  assert.equal(r.choices[0].text, gold.greedy_text);
  assert.equal(r.usage.completion_tokens, 200);
  assert.equal(r.usage.prompt_tokens, gold.prompt_tokens.length);
});

test('completions: streaming equals the golden, usage only when asked', async () => {
  for (const includeUsage of [false, true]) {
    const s = await gw.completions.create({
      model, prompt: gold.prompt, max_tokens: 200, temperature: 0, stream: true,
      ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
    });
    let text = '', usage = null, chunks = 0;
    for await (const c of s) {
      chunks++;
      for (const ch of c.choices) text += ch.text ?? '';
      if (c.usage) usage = c.usage;
    }
    assert.ok(chunks > 10, `only ${chunks} chunks`);
    assert.equal(text, gold.greedy_text);
    if (includeUsage) assert.equal(usage?.completion_tokens, 200);
    else assert.equal(usage, null);
  }
});

test('chat: streaming through the gateway equals the replica answering directly', async () => {
  const plain = await direct.chat.completions.create({ model, messages: MSGS, max_tokens: 30, temperature: 0 });
  const s = await gw.chat.completions.create({
    model, messages: MSGS, max_tokens: 30, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', role = null, usage = null;
  for await (const c of s) {
    for (const ch of c.choices) {
      if (ch.delta?.role) role = role ?? ch.delta.role;
      text += ch.delta?.content ?? '';
    }
    if (c.usage) usage = c.usage;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, plain.choices[0].message.content);
  assert.deepEqual(usage, plain.usage);
  const r = await gw.chat.completions.create({ model, messages: MSGS, max_tokens: 30, temperature: 0 });
  assert.equal(r.choices[0].message.content, plain.choices[0].message.content);
});

test('chat: SDK stream helper (finalChatCompletion) through the gateway', async () => {
  const runner = gw.chat.completions.stream({ model, messages: MSGS, max_tokens: 12, temperature: 0 });
  let deltas = '';
  runner.on('content', (d) => { deltas += d; });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content, deltas);
  assert.equal(final.choices[0].finish_reason, 'length');
});

test('embeddings through the gateway', async () => {
  const r = await gw.embeddings.create({ model: process.env.SERVAL_EMBED_MODEL_ID, input: ['a cat', 'a dog'] });
  assert.equal(r.data.length, 2);
  assert.ok(r.data[0].embedding.length > 0);
});

test('Anthropic Messages through the gateway (Anthropic SDK): equal to the replica, streamed too, usage in the ledger', async () => {
  const body = { model, max_tokens: 24, temperature: 0, system: 'You tell short stories.',
                 messages: [{ role: 'user', content: 'Tell me a story about a cat.' }] };
  const want = await anthDirect.messages.create(body);
  const before = await usageTotals();
  const got = await anth.messages.create(body);
  assert.deepEqual(got.content, want.content);
  assert.deepEqual(got.usage, want.usage);
  const stream = anth.messages.stream(body);
  let deltas = '';
  stream.on('text', (t) => { deltas += t; });
  const final = await stream.finalMessage();
  assert.deepEqual(final.content, want.content);
  assert.equal(deltas, want.content[0].text);
  assert.equal(final.usage.output_tokens, want.usage.output_tokens);
  await settle();
  const after = await usageTotals();
  // The ledger counts every prompt token, cached or not (Anthropic reports cache reads apart).
  const prompt = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0);
  const seen = JSON.stringify({ before, after, got: got.usage, streamed: final.usage });
  assert.equal(after.requests - before.requests, 2, seen);
  assert.equal(after.completion_tokens - before.completion_tokens, got.usage.output_tokens + final.usage.output_tokens, seen);
  assert.equal(after.prompt_tokens - before.prompt_tokens, prompt(got.usage) + prompt(final.usage), seen);
  assert.equal(prompt(got.usage), prompt(want.usage), 'the same prompt as the replica counted directly');
  // The gateway's own errors on this route come in Anthropic's shape.
  await assert.rejects(anth.messages.create({ ...body, model: 'no-such-model' }),
    (e) => e instanceof Anthropic.NotFoundError && e.error?.type === 'error' && e.error?.error?.type === 'not_found_error');
});

test('Responses API through the gateway: equal to the replica, streamed too', async () => {
  const body = { model, instructions: 'Be brief.', input: 'Tell me a story about a cat.', max_output_tokens: 20, temperature: 0 };
  const want = await direct.responses.create(body);
  const got = await gw.responses.create(body);
  assert.equal(got.output_text, want.output_text);
  assert.deepEqual(got.usage, want.usage);
  const s = await gw.responses.create({ ...body, stream: true });
  let text = '', final = null;
  for await (const ev of s) {
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  assert.equal(text, want.output_text);
  assert.equal(final?.usage?.output_tokens, want.usage.output_tokens);
});

test('errors map to the SDK classes: 404, 401, 403', async () => {
  await assert.rejects(gw.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  const bad = new OpenAI({ baseURL: process.env.SERVAL_GATEWAY_URL, apiKey: 'sk-wrong', maxRetries: 0 });
  await assert.rejects(bad.completions.create({ model, prompt: 'x', max_tokens: 1 }),
    (e) => e instanceof OpenAI.AuthenticationError);
  await assert.rejects(gw.completions.create({ model: 'restricted', prompt: 'x', max_tokens: 1 }),
    (e) => e instanceof OpenAI.PermissionDeniedError && e.code === 'model_not_allowed');
});

test('usage route agrees with what the SDK saw; budget exhaustion is a RateLimitError', async () => {
  const base = process.env.SERVAL_GATEWAY_URL;
  const admin = { Authorization: `Bearer ${process.env.SERVAL_GATEWAY_ADMIN}` };
  const before = await (await fetch(`${base}/gateway/usage?key=sdk`, { headers: admin })).json();
  const r = await gw.completions.create({ model, prompt: 'Once upon a time', max_tokens: 7, temperature: 0 });
  await new Promise((res) => setTimeout(res, 50));
  const after = await (await fetch(`${base}/gateway/usage?key=sdk`, { headers: admin })).json();
  assert.equal(after.total.requests - before.total.requests, 1);
  assert.equal(after.total.completion_tokens - before.total.completion_tokens, r.usage.completion_tokens);
  assert.equal(after.total.prompt_tokens - before.total.prompt_tokens, r.usage.prompt_tokens);
  // Spend until the budget runs out: the price makes one long answer exceed it.
  let err = null;
  for (let i = 0; i < 50 && !err; i++) {
    try {
      await gw.completions.create({ model, prompt: 'Once', max_tokens: 200, temperature: 0 });
    } catch (e) {
      err = e;
    }
  }
  assert.ok(err instanceof OpenAI.RateLimitError, `expected a RateLimitError, got ${err}`);
  assert.equal(err.code, 'budget_exceeded');
  assert.match(err.message, /budget of key 'sdk' exhausted/);
});

run('gateway_sdk_test');
