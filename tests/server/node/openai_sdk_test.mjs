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
import { run, test } from './runner.mjs';

const baseURL = process.env.SERVAL_BASE_URL;
const apiKey = process.env.SERVAL_API_KEY;
const model = process.env.SERVAL_MODEL_ID;
const golden = JSON.parse(readFileSync(process.env.SERVAL_GOLDEN, 'utf8'));
const gold = golden.cases[0];
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const MSGS = [{ role: 'user', content: 'Tell me a story about a cat.' }];


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

// --- Responses API ---------------------------------------------------------

const WEATHER_TOOL = {
  type: 'function', name: 'get_weather', description: 'Weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'],
                additionalProperties: false },
};

test('responses.create: greedy output equals chat completions', async () => {
  const r = await client.responses.create({
    model, instructions: 'Be brief.', input: 'Tell me a story about a cat.', max_output_tokens: 24, temperature: 0,
  });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.ok(['completed', 'incomplete'].includes(r.status));
  const chat = await client.chat.completions.create({
    model, max_tokens: 24, temperature: 0,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me a story about a cat.' }],
  });
  assert.equal(r.output_text, chat.choices[0].message.content);  // output_text: the SDK's join of output_text parts
  assert.equal(r.status, chat.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(r.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.instructions, 'Be brief.');
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].role, 'assistant');
});

test('responses.create: streamed events reassemble to the non-streamed response', async () => {
  const body = { model, input: [{ role: 'user', content: 'Tell me a story.' }], max_output_tokens: 20, temperature: 0 };
  const whole = await client.responses.create(body);
  const s = await client.responses.create({ ...body, stream: true });
  const types = [], seqs = [];
  let text = '', done = '', final = null;
  for await (const ev of s) {
    types.push(ev.type);
    seqs.push(ev.sequence_number);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.output_text.done') done = ev.text;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  assert.deepEqual(seqs, seqs.map((_, i) => i), 'sequence numbers count from 0');
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  for (const t of ['response.output_item.added', 'response.content_part.added', 'response.content_part.done',
                   'response.output_item.done'])
    assert.ok(types.includes(t), `${t} in ${types.join(',')}`);
  assert.equal(text, whole.output_text);
  assert.equal(done, whole.output_text);
  assert.equal(final.output[0].content[0].text, whole.output_text);
  assert.equal(final.status, whole.status);
  const { input_tokens_details: _a, ...finalUsage } = final.usage;  // cached_tokens differ: the prefix cache
  const { input_tokens_details: _b, ...wholeUsage } = whole.usage;
  assert.deepEqual(finalUsage, wholeUsage);
  // The SDK's stream helper.
  const helper = client.responses.stream(body);
  let helperText = '';
  helper.on('response.output_text.delta', (ev) => { helperText += ev.delta; });
  const fin = await helper.finalResponse();
  assert.equal(helperText, whole.output_text);
  // (The helper's final response has no output_text unless a format is parsed: read the item.)
  assert.equal(fin.output[0].content[0].text, whole.output_text);
});

test('responses: function tool round trip (stateless, and with previous_response_id)', async () => {
  const input = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const r = await client.responses.create({ model, input, tools: [WEATHER_TOOL], tool_choice: 'required', temperature: 0 });
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1, JSON.stringify(r.output));
  assert.equal(calls[0].name, 'get_weather');
  assert.match(calls[0].call_id, /^call_/);
  const args = JSON.parse(calls[0].arguments);
  assert.equal(typeof args.city, 'string');
  assert.ok(args.city.length <= 12);
  const answer = { type: 'function_call_output', call_id: calls[0].call_id, output: '{"temperature": 21}' };
  // Stateless: the client sends the whole conversation back.
  const r2 = await client.responses.create({
    model, input: [...input, ...r.output, answer], tools: [WEATHER_TOOL], max_output_tokens: 16, store: false,
  });
  assert.ok(['completed', 'incomplete'].includes(r2.status));
  assert.equal(r2.output[0].type, 'message');
  assert.equal(r2.store, false);
  // Stateful: the server remembers the first turn.
  const r3 = await client.responses.create({
    model, previous_response_id: r.id, input: [answer], tools: [WEATHER_TOOL], max_output_tokens: 16, temperature: 0,
  });
  const r2g = await client.responses.create({
    model, input: [...input, ...r.output, answer], tools: [WEATHER_TOOL], max_output_tokens: 16, temperature: 0,
    store: false,
  });
  assert.equal(r3.previous_response_id, r.id);
  assert.equal(r3.output_text, r2g.output_text, 'previous_response_id continues the same conversation');
  assert.equal(r3.usage.input_tokens, r2g.usage.input_tokens);
  // Streaming the call: argument deltas concatenate to the done arguments.
  const s = await client.responses.create({ model, input, tools: [WEATHER_TOOL], tool_choice: 'required', stream: true });
  let deltas = '', doneArgs = null, added = null;
  for await (const ev of s) {
    if (ev.type === 'response.output_item.added' && ev.item.type === 'function_call') added = ev.item;
    if (ev.type === 'response.function_call_arguments.delta') deltas += ev.delta;
    if (ev.type === 'response.function_call_arguments.done') doneArgs = ev.arguments;
  }
  assert.equal(added.name, 'get_weather');
  assert.equal(deltas, doneArgs);
  JSON.parse(doneArgs);
  // A tool result for a call nobody made is refused.
  await assert.rejects(
    client.responses.create({ model, input: [{ type: 'function_call_output', call_id: 'call_nope', output: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && /call_nope/.test(e.message));
});

test('responses: text.format json_schema, retrieve, delete, errors', async () => {
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 10 }, age: { type: 'integer', minimum: 0, maximum: 99 } },
                   required: ['name', 'age'], additionalProperties: false };
  const r = await client.responses.create({
    model, input: 'Describe a person.', text: { format: { type: 'json_schema', name: 'person', schema, strict: true } },
  });
  const obj = JSON.parse(r.output_text);
  assert.deepEqual(Object.keys(obj).sort(), ['age', 'name']);
  assert.ok(Number.isInteger(obj.age) && obj.age >= 0 && obj.age <= 99);
  assert.equal(r.text.format.type, 'json_schema');
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.equal(got.output_text, r.output_text);
  const del = await client.responses.delete(r.id);  // typed void by the SDK; serval answers {id, deleted: true}
  assert.equal(del?.deleted, true);
  await assert.rejects(client.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(client.responses.create({ model, input: 'x', previous_response_id: 'resp_unknown' }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
  await assert.rejects(client.responses.create({ model, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] }),
                       (e) => e instanceof OpenAI.BadRequestError && /input_image/.test(e.message));
  await assert.rejects(client.responses.create({ model, input: 'x', tools: [{ type: 'web_search' }] }),
                       (e) => e instanceof OpenAI.BadRequestError && /function tools/.test(e.message));
});

await run('server_openai_node');
