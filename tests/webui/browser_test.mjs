// The web UI in headless Chromium (puppeteer-core), against live servers
// started by run_browser_test.py: SERVAL_URL (--engine-control),
// SERVAL_KEY_URL (--api-key SERVAL_API_KEY), SERVAL_OFF_URL (--no-webui).
// The engine is paused and stepped over HTTP so "mid-answer" is a state the
// test makes, not a race it wins. Screenshots go to SERVAL_OUT.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { run, test } from '../server/node/runner.mjs';

const env = (k) => { const v = process.env[k]; if (!v) throw new Error(`${k} is not set`); return v; };
const BASE = env('SERVAL_URL'), KEY_BASE = env('SERVAL_KEY_URL'), OFF_BASE = env('SERVAL_OFF_URL');
const KEY = env('SERVAL_API_KEY'), OUT = env('SERVAL_OUT');
const puppeteer = createRequire(join(env('SERVAL_WEB_DIR'), 'package.json'))('puppeteer-core');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Waits, with a deadline, for something that must happen.
async function until(fn, what, ms = 15000) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(40);
  }
}
async function api(base, path, body, key) {
  const headers = { 'Content-Type': 'application/json' };
  if (key) headers.Authorization = `Bearer ${key}`;
  const r = await fetch(base + path, { method: body === undefined ? 'GET' : 'POST', headers,
    body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, json, text };
}
const state = async () => (await api(BASE, '/v1/engine/state')).json;
const pause = () => api(BASE, '/v1/engine/pause', {});
const resume = () => api(BASE, '/v1/engine/resume', {});
const step = (n = 1) => api(BASE, '/v1/engine/step', { steps: n });

const userData = mkdtempSync(join(tmpdir(), 'serval-webui-chromium-'));
const browser = await puppeteer.launch({
  executablePath: env('SERVAL_CHROMIUM'),
  headless: true,
  userDataDir: userData,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage', '--window-size=1400,900'],
  defaultViewport: { width: 1400, height: 900 },
});

// What must never happen on a page: a dialog (alert), an uncaught error, a
// CSP violation or other console error, a request to another origin.
const problems = [];
function watch(page, origin, { consoleErrors = true } = {}) {
  page.on('dialog', async (d) => { problems.push(`dialog '${d.message()}'`); await d.dismiss(); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && (consoleErrors || /Content Security Policy/i.test(m.text())))
      problems.push(`console error: ${m.text()}`);
  });
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.protocol !== 'data:' && u.protocol !== 'blob:' && u.origin !== origin) problems.push(`request to ${r.url()}`);
  });
}

const page = await browser.newPage();
watch(page, BASE);

const answers = () => page.$$eval('.msg.assistant .md', (els) => els.map((e) => e.textContent));
const lastAnswer = async () => { const a = await answers(); return a.length ? a[a.length - 1] : null; };
async function setField(testid, value) {
  const sel = `[data-testid="${testid}"]`;
  await page.$eval(sel, (el) => { el.value = ''; el.dispatchEvent(new Event('input', { bubbles: true })); });
  await page.click(sel);
  if (value !== '') await page.type(sel, value);
}
async function inFlight() { const s = await state(); return s.requests.in_flight_total + s.requests.running; }
// Steps the paused engine until the last answer has grown past `from` characters.
async function stepUntilLonger(from) {
  return until(async () => {
    const t = await lastAnswer();
    if (t !== null && t.length > from) return t;
    await step(1);
    return null;
  }, `the answer to grow past ${from} characters`);
}

test('the page loads with its security headers; --no-webui turns it off', async () => {
  const r = await api(BASE, '/');
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-security-policy'), /script-src 'self'/);
  assert.match(r.headers.get('content-security-policy'), /default-src 'none'/);
  assert.equal(r.headers.get('x-content-type-options'), 'nosniff');
  const off = await api(OFF_BASE, '/');
  assert.equal(off.status, 404);
  assert.equal(off.json.error.code, 'not_found');
  assert.match(off.json.error.message, /--no-webui/);
  const post = await api(BASE, '/', {});
  assert.equal(post.status, 405);
  await page.goto(BASE + '/', { waitUntil: 'networkidle0' });
  await page.waitForSelector('#prompt');
  await until(() => page.$eval('[data-testid="model"]', (s) => s.options.length > 0 && s.value === 'stories260K'),
    'the model picker to list the served model');
});

test('an answer streams in, and Stop ends the generation on the server', async () => {
  await setField('max_tokens', '1500');
  await setField('temperature', '1');
  await setField('extra', '{"ignore_eos": true}');
  await pause();
  try {
    await page.type('#prompt', 'Hello there');
    await page.click('#send');
    await until(async () => (await state()).requests.in_flight_total === 1, 'the request to reach the server');
    const first = await stepUntilLonger(0);
    const later = await stepUntilLonger(first.length);   // text keeps arriving while the request runs
    assert.ok(later.startsWith(first.trimEnd()), `streamed text is appended ('${first}' then '${later}')`);
    assert.ok(await page.$('#stop'), 'a Stop button while generating');
    await page.click('#stop');
    await page.waitForSelector('.msg.assistant .stopped');
    await until(async () => { await step(1); return (await inFlight()) === 0; }, 'the server to drop the request');
    const stoppedAt = await lastAnswer();
    await resume();
    await sleep(300);
    assert.equal(await lastAnswer(), stoppedAt, 'nothing arrives after Stop');
    assert.equal(await inFlight(), 0);
    await page.waitForSelector('#prompt');
  } finally {
    await resume();
  }
});

test('keyboard alone: focus order, Enter sends, Escape stops', async () => {
  // Tab from the top of a freshly loaded page reaches the conversation controls before the message box.
  await page.reload({ waitUntil: 'networkidle0' });
  await page.waitForSelector('#prompt');
  const order = [];
  for (let i = 0; i < 40; i++) {
    await page.keyboard.press('Tab');
    const id = await page.evaluate(() => {
      const e = document.activeElement;
      return e.id || e.getAttribute('data-testid') || `${e.tagName.toLowerCase()}:${e.textContent.trim().slice(0, 20)}`;
    });
    order.push(id);
    if (id === 'prompt') break;
  }
  assert.equal(order[order.length - 1], 'prompt', `Tab reaches the message box (order: ${order.join(', ')})`);
  assert.deepEqual(order.slice(0, 2), ['a:Chat', 'a:Dashboard'], 'the views come first');
  assert.ok(order.indexOf('new-chat') >= 0 && order.indexOf('new-chat') < order.indexOf('prompt'), 'New chat before the message box');
  await page.keyboard.type('Tell me a story');
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'send', 'Tab from the message box: Send');
  await page.keyboard.down('Shift'); await page.keyboard.press('Tab'); await page.keyboard.up('Shift');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'prompt');
  await pause();
  try {
    const before = (await answers()).length;
    await page.keyboard.press('Enter');
    await until(async () => (await answers()).length === before + 1, 'Enter to send the message');
    await stepUntilLonger(0);
    await page.keyboard.press('Escape');
    await page.waitForSelector('#send');
    await until(async () => { await step(1); return (await inFlight()) === 0; }, 'Escape to end the request');
    const stopped = await page.$$eval('.msg.assistant', (els) => !!els[els.length - 1].querySelector('.stopped'));
    assert.ok(stopped, 'the answer is marked stopped');
  } finally {
    await resume();
  }
});

test('a reload keeps the conversation', async () => {
  await page.reload({ waitUntil: 'networkidle0' });
  await page.waitForSelector('.msg.user');
  const users = await page.$$eval('.msg.user .text', (els) => els.map((e) => e.textContent));
  assert.deepEqual(users, ['Hello there', 'Tell me a story']);
  assert.equal((await answers()).length, 2);
  const titles = await page.$$eval('.convs .conv', (els) => els.map((e) => e.textContent));
  assert.ok(titles.includes('Hello there'), `conversation listed (${titles})`);
});

const PAYLOAD = '<img src=x onerror=alert(1)>';
test('HTML in a user message and in a model answer shows as text and runs nothing', async () => {
  await page.click('#new-chat');
  await setField('max_tokens', '64');
  await setField('extra', JSON.stringify({ grammar: `root ::= "${PAYLOAD}"` }));
  await page.type('#prompt', PAYLOAD);
  await page.keyboard.press('Enter');
  await until(async () => (await page.$('#send')) && (await lastAnswer()), 'the forced answer');
  assert.equal(await page.$eval('.msg.user .text', (e) => e.textContent), PAYLOAD);
  assert.equal((await lastAnswer()).trim(), PAYLOAD, 'the model answered the payload, shown as text');
  assert.equal(await page.$$eval('.messages img', (els) => els.length), 0, 'no <img> element');
  await sleep(200);
  assert.deepEqual(problems.filter((p) => p.startsWith('dialog')), [], 'no alert ran');
  // The answer's speed line: token counts under each answer.
  const stats = await page.$eval('.msg.assistant [data-testid="stats"]', (e) => e.textContent);
  assert.match(stats, /\d+ prompt \+ \d+ tokens/);
  assert.match(await page.$eval('[data-testid="context"]', (e) => e.textContent), /Context \d+ \/ 2048 tokens/);
  await page.screenshot({ path: join(OUT, 'chat.png') });
});

test('Markdown: highlighted code blocks, and no javascript: links', async () => {
  await page.click('#new-chat');
  await setField('max_tokens', '64');
  const answer = 'See [docs](javascript:alert(2)):\n\n```python\nprint(1)\n```\n';
  await setField('extra', JSON.stringify({ grammar: `root ::= ${JSON.stringify(answer)}` }));
  await page.type('#prompt', 'Show code');
  await page.keyboard.press('Enter');
  await until(async () => (await page.$('#send')) && (await page.$('.msg.assistant pre code')), 'the code block');
  const code = await page.$eval('.msg.assistant pre code', (e) => ({ text: e.textContent, spans: e.querySelectorAll('span[class^="hljs-"]').length }));
  assert.equal(code.text.trim(), 'print(1)');
  assert.ok(code.spans > 0, 'highlighted');
  const hrefs = await page.$$eval('.msg.assistant .md a', (els) => els.map((a) => a.getAttribute('href') || ''));
  // marked makes <a href="javascript:..."> of it; the sanitizer drops the href, the link text stays.
  assert.equal(hrefs.length, 1, 'the link is there');
  assert.ok(!/javascript:/i.test(hrefs[0]), `no javascript: link (${hrefs})`);
});

test('reasoning is shown collapsed above the answer', async () => {
  await page.click('#new-chat');
  await setField('max_tokens', '64');
  await setField('extra', JSON.stringify({ grammar: 'root ::= "<think>pondering the tale</think>The answer."' }));
  await page.type('#prompt', 'Think first');
  await page.keyboard.press('Enter');
  await until(async () => (await page.$('#send')) && (await lastAnswer()), 'the answer');
  assert.equal((await lastAnswer()).trim(), 'The answer.');
  const r = await page.$eval('.msg.assistant details.reasoning', (d) => ({ open: d.open, text: d.textContent }));
  assert.equal(r.open, false, 'collapsed');
  assert.match(r.text, /pondering the tale/);
});

test('JSON schema mode constrains the answer to the schema', async () => {
  await page.click('#new-chat');
  await setField('max_tokens', '200');
  await setField('extra', '');
  await page.click('::-p-text(JSON schema mode)');
  const schema = '{"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"], ' +
    '"additionalProperties": false}';
  await page.waitForSelector('.settings textarea.mono');
  await page.$eval('.settings textarea.mono', (el) => { el.value = ''; el.dispatchEvent(new Event('input', { bubbles: true })); });
  await page.type('.settings textarea.mono', schema);
  await page.type('#prompt', 'Yes or no?');
  await page.keyboard.press('Enter');
  await until(async () => (await page.$('#send')) && (await lastAnswer()), 'the answer');
  const answer = JSON.parse(await lastAnswer());
  assert.ok(['yes', 'no'].includes(answer.answer), `answer ${JSON.stringify(answer)}`);
  assert.deepEqual(Object.keys(answer), ['answer']);
  await page.click('::-p-text(JSON schema mode)');   // off again for the tests after
});

test('Regenerate replaces the last answer; Edit resends from the edited message', async () => {
  await page.click('#new-chat');
  await setField('max_tokens', '16');
  await setField('extra', JSON.stringify({ grammar: 'root ::= "first"' }));
  await page.type('#prompt', 'Original question');
  await page.keyboard.press('Enter');
  await until(async () => (await page.$('#send')) && (await lastAnswer()) === 'first\n', 'the first answer');
  await setField('extra', JSON.stringify({ grammar: 'root ::= "second"' }));
  await page.click('::-p-text(Regenerate)');
  await until(async () => (await page.$('#send')) && (await lastAnswer()) === 'second\n', 'the regenerated answer');
  assert.equal((await answers()).length, 1, 'the answer was replaced, not added');
  await setField('extra', JSON.stringify({ grammar: 'root ::= "third"' }));
  await page.click('.msg.user ::-p-text(Edit)');
  await page.waitForSelector('#edit-0');
  await page.$eval('#edit-0', (el) => { el.value = ''; el.dispatchEvent(new Event('input', { bubbles: true })); });
  await page.type('#edit-0', 'Edited question');
  await page.click('.msg.user.editing ::-p-text(Send)');
  await until(async () => (await page.$('#send')) && (await lastAnswer()) === 'third\n', 'the answer to the edit');
  assert.deepEqual(await page.$$eval('.msg.user .text', (els) => els.map((e) => e.textContent)), ['Edited question']);
  assert.equal((await answers()).length, 1);
  await setField('extra', '');
});

test('export, then import into a fresh browser profile', async () => {
  const dl = mkdtempSync(join(tmpdir(), 'serval-webui-dl-'));
  const cdp = await page.createCDPSession();
  await cdp.send('Browser.setDownloadBehavior', { behavior: 'allow', downloadPath: dl });
  await page.click('::-p-text(Export)');
  const file = join(dl, 'serval-conversations.json');
  await until(() => existsSync(file) && readFileSync(file, 'utf8').endsWith('}'), 'the export download');
  const exported = JSON.parse(readFileSync(file, 'utf8'));
  assert.equal(exported.format, 'serval.conversations');
  assert.equal(exported.conversations.length, 6);
  const ctx = await browser.createBrowserContext();
  const fresh = await ctx.newPage();
  watch(fresh, BASE);
  await fresh.goto(BASE + '/', { waitUntil: 'networkidle0' });
  assert.equal(await fresh.$$eval('.msg', (els) => els.length), 0, 'a fresh profile has no messages');
  const input = await fresh.$('input[type=file]');
  await input.uploadFile(file);
  await fresh.waitForSelector('.msg.user');
  const titles = await fresh.$$eval('.convs .conv', (els) => els.map((e) => e.textContent));
  assert.ok(titles.includes('Hello there') && titles.includes(PAYLOAD), `imported titles (${titles})`);
  // A bad file is refused with a message, and nothing is lost.
  const bad = join(dl, 'bad.json');
  writeFileSync(bad, '{"conversations": [{"id": 1}]}');
  await input.uploadFile(bad);
  await fresh.waitForSelector('.banner');
  assert.match(await fresh.$eval('.banner', (e) => e.textContent), /import: conversation 0/);
  await ctx.close();
  rmSync(dl, { recursive: true, force: true });
});

test('the dashboard charts tokens/s and latency while a load runs', async () => {
  await page.goto(BASE + '/#/dashboard', { waitUntil: 'networkidle0' });
  await page.waitForSelector('[data-chart="tokens"]');
  assert.equal(await page.$eval('[data-testid="model-name"]', (e) => e.textContent), 'stories260K');
  let loading = true;
  const load = async () => {
    while (loading)
      await api(BASE, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 300, ignore_eos: true, temperature: 1 });
  };
  const workers = [load(), load(), load()];
  try {
    const chart = (id) => page.$eval(`[data-chart="${id}"]`, (e) => ({ points: +e.dataset.points, last: e.dataset.last }));
    const p0 = (await chart('tokens')).points;
    await until(async () => { const c = await chart('tokens'); return c.points >= p0 + 2 && +c.last > 0; },
      'the tokens/s chart to move');
    await until(async () => (await chart('ttft')).last !== '', 'a TTFT percentile');
    await until(async () => (await chart('itl')).last !== '', 'an inter-token latency percentile');
    const c1 = await chart('tokens');
    await until(async () => (await chart('tokens')).points > c1.points, 'another point');
    await page.screenshot({ path: join(OUT, 'dashboard.png'), fullPage: true });
    const cfg = await page.$eval('.dashboard', (e) => e.textContent);
    assert.match(cfg, /max_seqs/);
    assert.match(cfg, /kernels/);
  } finally {
    loading = false;
    await Promise.all(workers);
  }
});

test('with an API key: the page asks for it, keeps it for the tab only, and chats', async () => {
  const ctx = await browser.createBrowserContext();
  const p = await ctx.newPage();
  watch(p, KEY_BASE, { consoleErrors: false });   // the first, keyless calls fail with 401 by design
  await p.goto(KEY_BASE + '/', { waitUntil: 'networkidle0' });
  await p.waitForSelector('#api-key');             // a 401 opens the key form
  assert.match(await p.$eval('.banner', (e) => e.textContent), /401/);
  await p.type('#api-key', KEY);
  await p.keyboard.press('Enter');
  await until(() => p.$eval('[data-testid="model"]', (s) => s.options.length > 0), 'the models after the key');
  await p.type('#prompt', 'Hi');
  await p.keyboard.press('Enter');
  await until(async () => (await p.$('#send')) && (await p.$('.msg.assistant [data-testid="stats"]')), 'an answer');
  const stored = await p.evaluate(() => ({ session: sessionStorage.getItem('serval.apiKey'),
    local: JSON.stringify(localStorage) }));
  assert.equal(stored.session, KEY);
  assert.ok(!stored.local.includes(KEY), 'the key is not in local storage');
  await p.screenshot({ path: join(OUT, 'apikey.png') });
  await ctx.close();
});

test('no dialog, page error, CSP violation or request to another origin on any page', async () => {
  assert.deepEqual(problems, []);
});

try {
  await run('webui_browser');
} finally {
  await browser.close();
  rmSync(userData, { recursive: true, force: true });
}
