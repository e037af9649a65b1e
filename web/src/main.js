// serval's web UI: the chat and the operations dashboard (hash routes #/chat
// and #/dashboard), with the API key asked once and kept for the tab.
import { html, render } from 'htm/preact';
import { useEffect, useState } from 'preact/hooks';
import 'uplot/dist/uPlot.min.css';
import 'highlight.js/styles/github.css';
import './style.css';
import { apiKey, setApiKey } from './api.js';
import { Chat } from './chat.js';
import { Dashboard } from './dashboard.js';

const route = () => (location.hash === '#/dashboard' ? 'dashboard' : 'chat');

function KeyForm({ onDone }) {
  const [k, setK] = useState(apiKey());
  return html`<form class="keyform" onSubmit=${(e) => { e.preventDefault(); setApiKey(k.trim()); onDone(); }}>
    <label for="api-key">API key</label>
    <input id="api-key" type="password" autocomplete="off" value=${k} onInput=${(e) => setK(e.target.value)} />
    <button type="submit">Save</button>
    <span class="hint">kept in this tab only</span>
  </form>`;
}

function App() {
  const [view, setView] = useState(route());
  const [error, setError] = useState('');
  const [askKey, setAskKey] = useState(false);
  const [epoch, setEpoch] = useState(0);   // remounts the views when the key changes
  useEffect(() => {
    const on = () => setView(route());
    window.addEventListener('hashchange', on);
    return () => window.removeEventListener('hashchange', on);
  }, []);
  const onError = (msg) => {
    setError(msg);
    if (/^.*\b401\b/.test(msg)) setAskKey(true);
  };
  return html`<div class="app">
    <header>
      <span class="brand">serval</span>
      <nav aria-label="Views">
        <a href="#/chat" aria-current=${view === 'chat' ? 'page' : undefined}>Chat</a>
        <a href="#/dashboard" aria-current=${view === 'dashboard' ? 'page' : undefined}>Dashboard</a>
      </nav>
      <button class="secondary" onClick=${() => setAskKey(!askKey)}>${apiKey() ? 'API key ✓' : 'API key'}</button>
    </header>
    ${askKey && html`<${KeyForm} onDone=${() => { setAskKey(false); setError(''); setEpoch(epoch + 1); }} />`}
    ${error && html`<div class="banner" role="alert">${error} <button class="link" onClick=${() => setError('')}>dismiss</button></div>`}
    <main key=${epoch}>
      ${view === 'chat' ? html`<${Chat} onError=${onError} />` : html`<${Dashboard} onError=${onError} />`}
    </main>
  </div>`;
}

render(html`<${App} />`, document.getElementById('app'));
