// HTTP calls to the serving API, with the API key the user entered (kept in
// session storage: it goes when the tab closes).
const KEY = 'serval.apiKey';

export const apiKey = () => sessionStorage.getItem(KEY) || '';
export function setApiKey(k) {
  if (k) sessionStorage.setItem(KEY, k);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const k = apiKey();
  if (k) h.Authorization = 'Bearer ' + k;
  return h;
}

async function toError(r) {
  let msg = `${r.status} ${r.statusText}`;
  try {
    const j = await r.json();
    if (j && j.error && j.error.message) msg = `${r.status}: ${j.error.message}`;
  } catch { /* not JSON */ }
  return new ApiError(r.status, msg);
}

export async function getJson(path, signal) {
  const r = await fetch(path, { headers: headers(), signal });
  if (!r.ok) throw await toError(r);
  return r.json();
}

// Streams a chat completion: yields each parsed SSE `data:` object.
export async function* streamChat(body, signal) {
  const r = await fetch('/v1/chat/completions', {
    method: 'POST',
    headers: headers(),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!r.ok) throw await toError(r);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = event.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
      if (!data) continue;
      if (data === '[DONE]') return;
      const j = JSON.parse(data);
      if (j.error) throw new ApiError(0, j.error.message || 'stream error');
      yield j;
    }
  }
}
