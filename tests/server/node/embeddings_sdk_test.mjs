// End-to-end tests of `serval serve`'s /v1/embeddings with the official OpenAI
// Node SDK, against a synthetic bert embedding model (SERVAL_EMBED_BASE_URL,
// SERVAL_EMBED_MODEL_ID; same API key). The SDK asks for base64 by default
// and decodes it into floats; asking for float returns the JSON numbers. Both
// must agree, be unit vectors, and keep each input's embedding whether it is
// sent alone or with others.
// Prints one line per test and a closing "N passed, M failed"; exit status 1 on failure.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { run, test } from './runner.mjs';

const client = new OpenAI({
  baseURL: process.env.SERVAL_EMBED_BASE_URL, apiKey: process.env.SERVAL_API_KEY, maxRetries: 0, timeout: 60_000,
});
const model = process.env.SERVAL_EMBED_MODEL_ID;
const TEXTS = ['the cat sat on the mat', 'databases index their rows', 'hello world'];
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

test('embeddings.create: float and base64 agree, unit vectors', async () => {
  const f = await client.embeddings.create({ model, input: TEXTS, encoding_format: 'float' });
  const b = await client.embeddings.create({ model, input: TEXTS });  // the SDK's default: base64, decoded
  assert.equal(f.object, 'list');
  assert.equal(f.model, model);
  assert.equal(f.data.length, TEXTS.length);
  assert.equal(b.data.length, TEXTS.length);
  for (let i = 0; i < TEXTS.length; i++) {
    assert.equal(f.data[i].index, i);
    assert.equal(f.data[i].embedding.length, 128);
    assert.equal(b.data[i].embedding.length, 128);
    assert.ok(Math.abs(norm(f.data[i].embedding) - 1) < 1e-5);
    for (let k = 0; k < 128; k++) assert.ok(Math.abs(f.data[i].embedding[k] - b.data[i].embedding[k]) < 1e-7);
  }
  assert.ok(f.usage.prompt_tokens > TEXTS.length);
  assert.equal(f.usage.total_tokens, f.usage.prompt_tokens);
});

test('embeddings.create: one input alone equals it in a batch; dimensions', async () => {
  const all = await client.embeddings.create({ model, input: TEXTS, encoding_format: 'float' });
  const one = await client.embeddings.create({ model, input: TEXTS[1], encoding_format: 'float' });
  assert.deepEqual(one.data[0].embedding, all.data[1].embedding);
  const short = await client.embeddings.create({ model, input: TEXTS[1], dimensions: 16 });
  assert.equal(short.data[0].embedding.length, 16);
  assert.ok(Math.abs(norm(short.data[0].embedding) - 1) < 1e-5);
});

test('embeddings.create: errors are APIError 400 with the field', async () => {
  await assert.rejects(client.embeddings.create({ model, input: '' }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.param, 'input');
    return true;
  });
  await assert.rejects(client.embeddings.create({ model: 'nope', input: 'x' }), (e) => e.status === 404);
});

await run('embeddings_sdk_test');
