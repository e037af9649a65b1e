// End-to-end tests of `serval serve` with the official Anthropic TypeScript SDK
// (messages.create, messages.stream, messages.countTokens, tool use, errors).
// Run by tests/server/run_node_test.py with the same environment as
// openai_sdk_test.mjs (SERVAL_BASE_URL ends in /v1; the Anthropic SDK adds
// /v1/messages itself). The greedy answers are checked against
// /v1/chat/completions for the same conversation: the translation must not
// change what the model sees or says.
// Prints one line per test and a closing "N passed, M failed"; exit status 1 on failure.
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { run, test } from './runner.mjs';

const base = process.env.SERVAL_BASE_URL.replace(/\/v1$/, '');
const apiKey = process.env.SERVAL_API_KEY;
const model = process.env.SERVAL_MODEL_ID;
const client = new Anthropic({ baseURL: base, apiKey, maxRetries: 0, timeout: 60_000 });
const SYSTEM = 'You tell short stories.';
const USER = 'Tell me a story about a cat.';
const WEATHER = {
  name: 'get_weather', description: 'Weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'],
                  additionalProperties: false },
};


async function chatGreedy(messages, max_tokens, extra = {}) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, messages, max_tokens, temperature: 0, ...extra }),
  });
  assert.equal(r.status, 200);
  return r.json();
}

test('messages.create: greedy text equals chat completions', async () => {
  const m = await client.messages.create({
    model, max_tokens: 24, temperature: 0, system: SYSTEM, messages: [{ role: 'user', content: USER }],
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, model);
  const chat = await chatGreedy([{ role: 'system', content: SYSTEM }, { role: 'user', content: USER }], 24);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.content[0].text, chat.choices[0].message.content);
  assert.equal(m.stop_reason, chat.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, chat.usage.prompt_tokens);
  assert.equal(m.usage.output_tokens, chat.usage.completion_tokens);
});

test('messages.stream: events reassemble to the non-streamed message', async () => {
  const body = { model, max_tokens: 30, temperature: 0, system: [{ type: 'text', text: SYSTEM }],
                 messages: [{ role: 'user', content: [{ type: 'text', text: USER }] }] };
  const whole = await client.messages.create(body);
  const stream = client.messages.stream(body);
  let text = '';
  const types = [];
  stream.on('text', (t) => { text += t; });
  stream.on('streamEvent', (ev) => types.push(ev.type));
  const fin = await stream.finalMessage();
  assert.equal(text, whole.content[0].text);
  assert.deepEqual(fin.content, whole.content);
  assert.equal(fin.stop_reason, whole.stop_reason);
  assert.equal(fin.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  assert.ok(types.includes('content_block_start') && types.includes('content_block_stop'));
  // The raw stream (create with stream: true) as well.
  const raw = await client.messages.create({ ...body, stream: true });
  let rawText = '', start = null;
  for await (const ev of raw) {
    if (ev.type === 'message_start') start = ev.message;
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') rawText += ev.delta.text;
  }
  assert.equal(rawText, whole.content[0].text);
  assert.equal(start.usage.input_tokens, whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
});

test('stop_sequences: stop_reason stop_sequence names the one that matched', async () => {
  const messages = [{ role: 'user', content: USER }];
  const free = await client.messages.create({ model, max_tokens: 40, temperature: 0, messages });
  const words = free.content[0].text.split(/\s+/).filter((w) => w.length >= 3);
  assert.ok(words.length >= 2, free.content[0].text);
  const stop = words[1];
  const m = await client.messages.create({ model, max_tokens: 40, temperature: 0, messages, stop_sequences: ['zzzq', stop] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(free.content[0].text.indexOf(stop), m.content.length ? m.content[0].text.length : 0);
  const s = await client.messages.stream({ model, max_tokens: 40, temperature: 0, messages, stop_sequences: [stop] }).finalMessage();
  assert.equal(s.stop_reason, 'stop_sequence');
  assert.equal(s.stop_sequence, stop);
});

test('tools: tool_use (streamed and not) and a tool_result round trip', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const m = await client.messages.create({
    model, max_tokens: 100, temperature: 0, messages, tools: [WEATHER], tool_choice: { type: 'tool', name: 'get_weather' },
  });
  assert.equal(m.stop_reason, 'tool_use');
  const uses = m.content.filter((b) => b.type === 'tool_use');
  assert.equal(uses.length, 1, JSON.stringify(m.content));
  assert.equal(uses[0].name, 'get_weather');
  assert.match(uses[0].id, /^toolu_/);
  assert.equal(typeof uses[0].input.city, 'string');
  assert.ok(uses[0].input.city.length <= 12);
  const s = await client.messages.stream({
    model, max_tokens: 100, temperature: 0, messages, tools: [WEATHER], tool_choice: { type: 'any' },
  }).finalMessage();
  assert.equal(s.stop_reason, 'tool_use');
  assert.deepEqual(s.content.map((b) => [b.type, b.name, b.input]), m.content.map((b) => [b.type, b.name, b.input]));
  const next = await client.messages.create({
    model, max_tokens: 16, tools: [WEATHER],
    messages: [...messages, { role: 'assistant', content: m.content },
               { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: '21 degrees' }] }],
  });
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(next.stop_reason));
  await assert.rejects(client.messages.create({
    model, max_tokens: 16,
    messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_nope', content: 'x' }] }],
  }), (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error' &&
                /toolu_nope/.test(e.error.error.message));
});

test('messages.countTokens equals the input tokens of the same request', async () => {
  const body = { model, system: SYSTEM, messages: [{ role: 'user', content: USER }], tools: [WEATHER] };
  const c = await client.messages.countTokens(body);
  const m = await client.messages.create({ ...body, max_tokens: 1 });
  assert.equal(c.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  assert.ok(c.input_tokens > 10);
});

test('errors come in Anthropic\'s shape and map to the SDK classes', async () => {
  const bad = new Anthropic({ baseURL: base, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
                       (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 &&
                              e.error?.type === 'error' && e.error?.error?.type === 'authentication_error');
  await assert.rejects(client.messages.create({
    model, max_tokens: 5,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }],
  }), (e) => e instanceof Anthropic.BadRequestError && /image/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ model, messages: [{ role: 'user', content: 'x' }] }),
                       (e) => e instanceof Anthropic.BadRequestError && /max_tokens/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ model: 'no-such-model', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
                       (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
});

await run('server_anthropic_node');
