// End-to-end tests of `serval serve` with the official OpenAI Node SDK.
// Run by tests/server/run_node_test.py, which installs the SDK (npm ci), starts
// the server and passes:
//   SERVAL_BASE_URL  http://127.0.0.1:PORT/v1
//   SERVAL_API_KEY   the key the server was started with (--api-key)
//   SERVAL_GOLDEN    path of ../shared/golden/stories260K-greedy.json
//   SERVAL_MODEL_ID  the served model name
// Prints one line per test and a closing "N passed, M failed"; exit status 1 on failure.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI, { toFile } from 'openai';

const baseURL = process.env.SERVAL_BASE_URL;
const apiKey = process.env.SERVAL_API_KEY;
const model = process.env.SERVAL_MODEL_ID;
const golden = JSON.parse(readFileSync(process.env.SERVAL_GOLDEN, 'utf8'));
const gold = golden.cases[0];
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const MSGS = [{ role: 'user', content: 'Tell me a story about a cat.' }];

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

async function metric(name) {
  const r = await fetch(baseURL.replace(/\/v1$/, '') + '/metrics', { headers: { Authorization: `Bearer ${apiKey}` } });
  assert.equal(r.status, 200);
  let sum = null;
  for (const line of (await r.text()).split('\n')) {
    if (line.startsWith(name + '{') || line.startsWith(name + ' ')) sum = (sum ?? 0) + Number(line.split(' ').pop());
  }
  return sum;
}

test('models.list', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [model]);
});

test('completions: greedy text equals the golden (llama.cpp)', async () => {
  const r = await client.completions.create({ model, prompt: gold.prompt, max_tokens: 200, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].text, gold.greedy_text);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.deepEqual([r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens],
                   [gold.prompt_tokens.length, 200, gold.prompt_tokens.length + 200]);
});

test('completions: streaming with include_usage', async () => {
  const s = await client.completions.create({
    model, prompt: gold.prompt, max_tokens: 200, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', finish = [], usage = null, chunks = 0;
  for await (const c of s) {
    chunks++;
    for (const ch of c.choices) {
      text += ch.text ?? '';
      if (ch.finish_reason) finish.push(ch.finish_reason);
    }
    if (c.usage) usage = c.usage;
  }
  assert.ok(chunks > 10, `only ${chunks} chunks`);
  assert.equal(text, gold.greedy_text);
  assert.deepEqual(finish, ['length']);
  assert.equal(usage?.completion_tokens, 200);
  assert.equal(usage?.prompt_tokens, gold.prompt_tokens.length);
});

test('completions: stop, n, seed, logprobs, echo', async () => {
  const stop = await client.completions.create({ model, prompt: gold.prompt, max_tokens: 50, temperature: 0, stop: ['Lily'] });
  assert.equal(stop.choices[0].text, gold.greedy_text.slice(0, gold.greedy_text.indexOf('Lily')));
  assert.equal(stop.choices[0].finish_reason, 'stop');
  const a = await client.completions.create({ model, prompt: 'Tom', max_tokens: 16, temperature: 1, n: 3, seed: 11 });
  const b = await client.completions.create({ model, prompt: 'Tom', max_tokens: 16, temperature: 1, n: 3, seed: 11 });
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
  assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text), 'same seed, same samples');
  assert.equal(a.usage.completion_tokens, 48);
  const lp = await client.completions.create({ model, prompt: gold.prompt, max_tokens: 5, temperature: 0, logprobs: 2 });
  assert.equal(lp.choices[0].logprobs.tokens.join(''), lp.choices[0].text);
  assert.equal(lp.choices[0].logprobs.token_logprobs.length, 5);
  const e = await client.completions.create({ model, prompt: gold.prompt, max_tokens: 5, temperature: 0, echo: true });
  assert.equal(e.choices[0].text, gold.prompt + lp.choices[0].text);
});

test('chat: non-streaming', async () => {
  const r = await client.chat.completions.create({ model, messages: MSGS, max_tokens: 20, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl/);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(c.message.content.length > 0);
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 20);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 20);
});

test('chat: streaming equals non-streaming', async () => {
  const plain = await client.chat.completions.create({ model, messages: MSGS, max_tokens: 30, temperature: 0 });
  const s = await client.chat.completions.create({
    model, messages: MSGS, max_tokens: 30, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', role = null, finish = [], usage = null;
  for await (const c of s) {
    for (const ch of c.choices) {
      if (ch.delta?.role) role = role ?? ch.delta.role;
      text += ch.delta?.content ?? '';
      if (ch.finish_reason) finish.push(ch.finish_reason);
    }
    if (c.usage) usage = c.usage;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, plain.choices[0].message.content);
  assert.deepEqual(finish, ['length']);
  assert.deepEqual(usage, plain.usage);
});

test('chat: SDK stream helper (finalChatCompletion)', async () => {
  const plain = await client.chat.completions.create({ model, messages: MSGS, max_tokens: 12, temperature: 0 });
  const runner = client.chat.completions.stream({ model, messages: MSGS, max_tokens: 12, temperature: 0 });
  let deltas = '';
  runner.on('content', (d) => { deltas += d; });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content, plain.choices[0].message.content);
  assert.equal(deltas, plain.choices[0].message.content);
  assert.equal(final.choices[0].finish_reason, 'length');
});

test('chat: n, stop, logprobs', async () => {
  const r = await client.chat.completions.create({
    model, messages: MSGS, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 10);
  assert.equal(content.map((t) => t.token).join(''), r.choices[0].message.content);
  for (const t of content) assert.equal(t.top_logprobs.length, 2);
  const n = await client.chat.completions.create({ model, messages: MSGS, max_tokens: 6, temperature: 1, n: 2, seed: 5 });
  assert.deepEqual(n.choices.map((c) => c.index), [0, 1]);
  assert.equal(n.usage.completion_tokens, 12);
  const words = r.choices[0].message.content.split(/\s+/).filter((w) => w.length > 2);
  if (words.length) {
    const st = await client.chat.completions.create({ model, messages: MSGS, max_tokens: 10, temperature: 0, stop: [words[0]] });
    assert.equal(st.choices[0].finish_reason, 'stop');
    assert.ok(!st.choices[0].message.content.includes(words[0]));
  }
});

test('errors map to the SDK error classes', async () => {
  await assert.rejects(
    client.completions.create({ model, prompt: gold.prompt, max_tokens: 5, temperature: 'hot' }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature' && e.type === 'invalid_request_error');
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: MSGS, max_tokens: 5 }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found');
  const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(
    client.chat.completions.create({ model, messages: MSGS, max_tokens: 5, stream: true, n: 1000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
});

test('aborting a stream frees its KV blocks', async () => {
  const s = await client.completions.create({
    model, prompt: gold.prompt, max_tokens: 2000, temperature: 0, ignore_eos: true, stream: true,
  });
  let n = 0;
  for await (const _ of s) {
    if (++n === 5) break; // leaving the loop aborts the request
  }
  const t0 = Date.now();
  let used = null;
  while (Date.now() - t0 < 3000) {
    used = [await metric('serval_kv_blocks_used'), await metric('serval_requests_running')];
    if (used[0] === 0 && used[1] === 0) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.deepEqual(used, [0, 0], `kv_blocks_used, requests_running ${Date.now() - t0} ms after the abort`);
});

test('files + batches: upload, create, poll, download; bodies equal one-by-one requests', async () => {
  const bodies = [0, 1, 2].map((i) => ({
    model, messages: [{ role: 'user', content: `Tell me a story about the number ${i}.` }], max_tokens: 12, temperature: 0,
  }));
  const jsonl = bodies.map((body, i) => JSON.stringify({ custom_id: `c${i}`, method: 'POST', url: '/v1/chat/completions', body }))
    .join('\n') + '\nnot a json line\n';
  const file = await client.files.create({ file: await toFile(Buffer.from(jsonl), 'batch.jsonl'), purpose: 'batch' });
  assert.equal(file.object, 'file');
  assert.equal(file.purpose, 'batch');
  assert.equal(file.bytes, Buffer.byteLength(jsonl));
  assert.equal((await client.files.retrieve(file.id)).filename, 'batch.jsonl');
  let batch = await client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { suite: 'node' },
  });
  assert.equal(batch.object, 'batch');
  const t0 = Date.now();
  while (!['completed', 'failed', 'cancelled', 'expired'].includes(batch.status)) {
    assert.ok(Date.now() - t0 < 60_000, `batch still ${batch.status} after 60 s`);
    await new Promise((r) => setTimeout(r, 50));
    batch = await client.batches.retrieve(batch.id);
  }
  assert.equal(batch.status, 'completed');
  assert.deepEqual(batch.request_counts, { total: 4, completed: 3, failed: 1 });
  assert.deepEqual(batch.metadata, { suite: 'node' });
  const out = (await (await client.files.content(batch.output_file_id)).text()).trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(out.map((o) => o.custom_id), ['c0', 'c1', 'c2']);
  for (const [i, o] of out.entries()) {
    assert.equal(o.response.status_code, 200);
    const direct = await client.chat.completions.create(bodies[i]);
    assert.equal(o.response.body.choices[0].message.content, direct.choices[0].message.content);
    assert.deepEqual(o.response.body.usage.completion_tokens, direct.usage.completion_tokens);
  }
  const errs = (await (await client.files.content(batch.error_file_id)).text()).trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(errs.length, 1);
  assert.equal(errs[0].error.line, 4);
  const listed = [];
  for await (const b of client.batches.list({ limit: 10 })) listed.push(b.id);
  assert.ok(listed.includes(batch.id));
  const deleted = await client.files.delete(batch.output_file_id);
  assert.equal(deleted.deleted, true);
});

let passed = 0, failed = 0;
for (const t of tests) {
  const t0 = Date.now();
  try {
    await t.fn();
    passed++;
    console.log(`PASS ${t.name} (${((Date.now() - t0) / 1000).toFixed(2)} s)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${t.name}: ${e?.stack ?? e}`);
  }
}
console.log(`server_openai_node: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
