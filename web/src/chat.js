// The chat view: conversations, streaming answers with stop, regenerate,
// edit-and-resend, per-conversation settings, token counts and speed.
import { html } from 'htm/preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { getJson, streamChat } from './api.js';
import { renderMarkdown } from './markdown.js';
import * as store from './store.js';

function Message({ m, index, busy, onEdit, onRegenerate, last }) {
  const [editing, setEditing] = useState(false);
  const [draft, setDraft] = useState(m.content);
  if (m.role === 'user') {
    if (editing)
      return html`<div class="msg user editing" data-role="user">
        <label class="sr-only" for=${`edit-${index}`}>Edit message</label>
        <textarea id=${`edit-${index}`} value=${draft} onInput=${(e) => setDraft(e.target.value)} rows="3"></textarea>
        <div class="row">
          <button onClick=${() => { setEditing(false); onEdit(index, draft); }} disabled=${busy || !draft.trim()}>Send</button>
          <button class="secondary" onClick=${() => setEditing(false)}>Cancel</button>
        </div>
      </div>`;
    return html`<div class="msg user" data-role="user">
      <div class="text">${m.content}</div>
      <div class="tools"><button class="link" onClick=${() => { setDraft(m.content); setEditing(true); }} disabled=${busy}>Edit</button></div>
    </div>`;
  }
  const s = m.stats;
  return html`<div class="msg assistant" data-role="assistant">
    ${m.reasoning && html`<details class="reasoning"><summary>Reasoning</summary><div class="text">${m.reasoning}</div></details>`}
    <div class="md" dangerouslySetInnerHTML=${{ __html: renderMarkdown(m.content) }}></div>
    ${m.error && html`<div class="error" role="alert">${m.error}</div>`}
    <div class="meta">
      ${s && html`<span class="stats" data-testid="stats">${s.prompt_tokens ?? '?'} prompt + ${s.completion_tokens ?? '?'} tokens${s.tps ? ` · ${s.tps.toFixed(1)} tok/s` : ''}${s.ttft_ms != null ? ` · first token ${Math.round(s.ttft_ms)} ms` : ''}</span>`}
      ${m.stopped && html`<span class="stopped">stopped</span>`}
      ${last && html`<button class="link" onClick=${onRegenerate} disabled=${busy}>Regenerate</button>`}
    </div>
  </div>`;
}

function Settings({ conv, models, onChange }) {
  const s = conv.settings;
  const set = (k) => (e) => onChange({ ...s, [k]: e.target.type === 'checkbox' ? e.target.checked : e.target.value });
  let schemaError = '';
  if (s.json_mode) { try { JSON.parse(s.json_schema); } catch (e) { schemaError = e.message; } }
  let extraError = '';
  if (s.extra.trim()) { try { const x = JSON.parse(s.extra); if (!x || typeof x !== 'object' || Array.isArray(x)) extraError = 'expected a JSON object'; } catch (e) { extraError = e.message; } }
  return html`<aside class="settings" aria-label="Conversation settings">
    <h2>Settings</h2>
    <label>Model
      <select value=${s.model || (models[0] ? models[0].id : '')} onChange=${set('model')} data-testid="model">
        ${models.map((m) => html`<option value=${m.id}>${m.id}</option>`)}
      </select></label>
    <label>System prompt<textarea rows="3" value=${s.system} onInput=${set('system')} data-testid="system"></textarea></label>
    <div class="grid2">
      <label>Temperature<input type="number" min="0" max="2" step="0.1" value=${s.temperature} onInput=${set('temperature')} data-testid="temperature" /></label>
      <label>Top p<input type="number" min="0" max="1" step="0.05" value=${s.top_p} onInput=${set('top_p')} data-testid="top_p" /></label>
      <label>Max tokens<input type="number" min="1" step="1" value=${s.max_tokens} onInput=${set('max_tokens')} data-testid="max_tokens" /></label>
      <label>Seed<input type="number" step="1" value=${s.seed} placeholder="random" onInput=${set('seed')} data-testid="seed" /></label>
    </div>
    <label class="check"><input type="checkbox" checked=${s.json_mode} onChange=${set('json_mode')} /> JSON schema mode</label>
    ${s.json_mode && html`<label>JSON schema<textarea class="mono" rows="6" value=${s.json_schema} onInput=${set('json_schema')}></textarea></label>`}
    ${schemaError && html`<div class="error">schema: ${schemaError}</div>`}
    <label>Extra request fields (JSON)<textarea class="mono" rows="3" placeholder='{"grammar": "root ::= ..."}' value=${s.extra} onInput=${set('extra')} data-testid="extra"></textarea></label>
    ${extraError && html`<div class="error">extra: ${extraError}</div>`}
  </aside>`;
}

function requestBody(conv, messages) {
  const s = conv.settings;
  const body = {
    model: s.model || undefined,
    messages: [...(s.system.trim() ? [{ role: 'system', content: s.system }] : []),
      ...messages.map((m) => ({ role: m.role, content: m.content }))],
    temperature: Number(s.temperature),
    top_p: Number(s.top_p),
    max_tokens: Math.max(1, parseInt(s.max_tokens, 10) || 1),
  };
  if (String(s.seed).trim() !== '') body.seed = parseInt(s.seed, 10);
  if (s.json_mode) body.response_format = { type: 'json_schema', json_schema: { name: 'schema', schema: JSON.parse(s.json_schema) } };
  if (s.extra.trim()) Object.assign(body, JSON.parse(s.extra));
  return body;
}

export function Chat({ onError }) {
  const [convs, setConvs] = useState(() => { const l = store.load(); return l.length ? l : [store.newConversation()]; });
  const [currentId, setCurrentId] = useState(() => convs[0].id);
  const [input, setInput] = useState('');
  const [models, setModels] = useState([]);
  const [busy, setBusy] = useState(false);
  const abortRef = useRef(null);
  const listRef = useRef(null);
  const inputRef = useRef(null);
  const fileRef = useRef(null);
  const conv = convs.find((c) => c.id === currentId) || convs[0];

  useEffect(() => { const err = store.save(convs); if (err) onError(err); }, [convs]);
  useEffect(() => {
    getJson('/v1/models').then((r) => setModels(r.data || [])).catch((e) => onError(`models: ${e.message}`));
  }, []);
  useEffect(() => { if (listRef.current) listRef.current.scrollTop = listRef.current.scrollHeight; });
  useEffect(() => {
    const onKey = (e) => { if (e.key === 'Escape' && abortRef.current) { e.preventDefault(); stop(); } };
    document.addEventListener('keydown', onKey);
    return () => document.removeEventListener('keydown', onKey);
  }, []);

  const update = (id, fn) => setConvs((list) => list.map((c) => (c.id === id ? fn(c) : c)));
  const model = models.find((m) => m.id === conv.settings.model) || models[0];
  const lastStats = [...conv.messages].reverse().find((m) => m.stats)?.stats;
  const ctxUsed = lastStats ? (lastStats.prompt_tokens || 0) + (lastStats.completion_tokens || 0) : 0;
  const ctxMax = model && model.max_model_len;

  function stop() {
    if (abortRef.current) abortRef.current.abort();
  }

  async function generate(id, messages) {
    const c = convs.find((x) => x.id === id);
    let body;
    try { body = requestBody(c, messages); } catch (e) { onError(`settings: ${e.message}`); return; }
    if (!body.model && model) body.model = model.id;
    const ctl = new AbortController();
    abortRef.current = ctl;
    setBusy(true);
    const answer = { role: 'assistant', content: '', reasoning: '' };
    const put = () => update(id, (x) => ({ ...x, messages: [...messages, { ...answer }] }));
    put();
    const t0 = performance.now();
    let tFirst = null;
    try {
      for await (const chunk of streamChat(body, ctl.signal)) {
        const d = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (d) {
          if (d.content) answer.content += d.content;
          if (d.reasoning_content) answer.reasoning += d.reasoning_content;
          if ((d.content || d.reasoning_content) && tFirst == null) tFirst = performance.now();
        }
        if (chunk.usage) {
          const t = performance.now();
          const gen = chunk.usage.completion_tokens;
          answer.stats = {
            prompt_tokens: chunk.usage.prompt_tokens,
            completion_tokens: gen,
            ttft_ms: tFirst != null ? tFirst - t0 : null,
            tps: tFirst != null && gen > 1 && t > tFirst ? (gen - 1) / ((t - tFirst) / 1000) : null,
          };
        }
        put();
      }
    } catch (e) {
      if (e.name === 'AbortError') answer.stopped = true;
      else answer.error = e.message;
      put();
    } finally {
      abortRef.current = null;
      setBusy(false);
      inputRef.current && inputRef.current.focus();
    }
  }

  function send() {
    const text = input.trim();
    if (!text || busy) return;
    setInput('');
    const messages = [...conv.messages.filter((m) => !m.error || m.content), { role: 'user', content: text }];
    update(conv.id, (x) => ({ ...x, title: x.messages.length ? x.title : text.slice(0, 60), messages }));
    generate(conv.id, messages);
  }

  function regenerate() {
    const msgs = conv.messages;
    const cut = msgs.length && msgs[msgs.length - 1].role === 'assistant' ? msgs.slice(0, -1) : msgs;
    generate(conv.id, cut);
  }

  function editAndResend(i, text) {
    const messages = [...conv.messages.slice(0, i), { role: 'user', content: text }];
    generate(conv.id, messages);
  }

  function newChat() {
    const c = store.newConversation();
    c.settings = { ...conv.settings };
    setConvs((l) => [c, ...l]);
    setCurrentId(c.id);
    inputRef.current && inputRef.current.focus();
  }

  function remove(id) {
    setConvs((l) => {
      const rest = l.filter((c) => c.id !== id);
      const out = rest.length ? rest : [store.newConversation()];
      if (id === currentId) setCurrentId(out[0].id);
      return out;
    });
  }

  function exportAll() {
    const blob = new Blob([store.exportJson(convs)], { type: 'application/json' });
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = 'serval-conversations.json';
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  async function importFile(e) {
    const f = e.target.files[0];
    e.target.value = '';
    if (!f) return;
    const r = store.importJson(await f.text(), convs);
    if (r.error) return onError(`import: ${r.error}`);
    setConvs((l) => [...r.conversations, ...l]);
    setCurrentId(r.conversations[0] ? r.conversations[0].id : currentId);
  }

  const onKeyDown = (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  };

  return html`<div class="chat">
    <nav class="sidebar" aria-label="Conversations">
      <button id="new-chat" onClick=${newChat}>New chat</button>
      <ul class="convs">
        ${convs.map((c) => html`<li class=${c.id === conv.id ? 'active' : ''}>
          <button class="conv" aria-current=${c.id === conv.id ? 'true' : undefined} onClick=${() => setCurrentId(c.id)}>${c.title}</button>
          <button class="link del" aria-label=${`Delete ${c.title}`} onClick=${() => remove(c.id)}>×</button>
        </li>`)}
      </ul>
      <div class="row">
        <button class="secondary" onClick=${exportAll}>Export</button>
        <button class="secondary" onClick=${() => fileRef.current.click()}>Import</button>
        <input type="file" accept="application/json,.json" ref=${fileRef} onChange=${importFile} hidden />
      </div>
    </nav>
    <section class="conversation" aria-label="Conversation">
      <div class="messages" ref=${listRef} aria-live="polite" data-testid="messages">
        ${conv.messages.length === 0 && html`<p class="empty">Send a message to start. Enter sends, Shift+Enter is a new line, Escape stops.</p>`}
        ${conv.messages.map((m, i) => html`<${Message} key=${i} m=${m} index=${i} busy=${busy}
            last=${i === conv.messages.length - 1 && m.role === 'assistant'} onEdit=${editAndResend} onRegenerate=${regenerate} />`)}
      </div>
      <div class="composer">
        <label class="sr-only" for="prompt">Message</label>
        <textarea id="prompt" ref=${inputRef} rows="3" placeholder="Message (Enter to send, Escape to stop)"
          value=${input} onInput=${(e) => setInput(e.target.value)} onKeyDown=${onKeyDown}></textarea>
        ${busy
          ? html`<button id="stop" class="danger" onClick=${stop}>Stop</button>`
          : html`<button id="send" onClick=${send} disabled=${!input.trim()}>Send</button>`}
      </div>
      <div class="ctx" data-testid="context">
        <span>Context ${ctxUsed}${ctxMax ? ` / ${ctxMax}` : ''} tokens</span>
        ${ctxMax ? html`<meter min="0" max=${ctxMax} value=${ctxUsed} high=${ctxMax * 0.9} aria-label="Context used"></meter>` : ''}
      </div>
    </section>
    <${Settings} conv=${conv} models=${models} onChange=${(s) => update(conv.id, (x) => ({ ...x, settings: s }))} />
  </div>`;
}
