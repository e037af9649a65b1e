// Conversations, kept in the browser's local storage; import and export as JSON.
const KEY = 'serval.conversations';
const MAX_IMPORT_BYTES = 20 * 1024 * 1024;

export const defaultSettings = () => ({
  model: '',
  system: '',
  temperature: 0.8,
  top_p: 0.95,
  max_tokens: 512,
  seed: '',
  json_mode: false,
  json_schema: '{\n  "type": "object",\n  "properties": {"answer": {"type": "string"}},\n  "required": ["answer"]\n}',
  extra: '',
});

export const newConversation = () => ({
  id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`,
  title: 'New chat',
  created: Date.now(),
  settings: defaultSettings(),
  messages: [],
});

export function load() {
  try {
    const list = JSON.parse(localStorage.getItem(KEY) || '[]');
    return Array.isArray(list) ? list.filter(valid) : [];
  } catch {
    return [];
  }
}

export function save(list) {
  try {
    localStorage.setItem(KEY, JSON.stringify(list));
    return '';
  } catch (e) {
    return `could not save conversations: ${e.message}`;
  }
}

function valid(c) {
  return c && typeof c === 'object' && typeof c.id === 'string' && Array.isArray(c.messages) &&
    c.messages.every((m) => m && (m.role === 'user' || m.role === 'assistant') && typeof m.content === 'string');
}

export function exportJson(list) {
  return JSON.stringify({ format: 'serval.conversations', version: 1, conversations: list }, null, 2);
}

// Returns {conversations} or {error}; imported ids that exist are renamed.
export function importJson(text, existing) {
  if (text.length > MAX_IMPORT_BYTES) return { error: 'file too large (20 MiB at most)' };
  let data;
  try { data = JSON.parse(text); } catch (e) { return { error: `not JSON: ${e.message}` }; }
  const list = Array.isArray(data) ? data : data && data.conversations;
  if (!Array.isArray(list)) return { error: 'expected {"conversations": [...]} or an array of conversations' };
  const bad = list.findIndex((c) => !valid(c));
  if (bad >= 0) return { error: `conversation ${bad}: needs an id and messages of role user/assistant with string content` };
  const ids = new Set(existing.map((c) => c.id));
  const out = list.map((c) => {
    const conv = { ...newConversation(), ...c, settings: { ...defaultSettings(), ...(c.settings || {}) } };
    if (ids.has(conv.id)) conv.id = newConversation().id;
    ids.add(conv.id);
    return conv;
  });
  return { conversations: out };
}
