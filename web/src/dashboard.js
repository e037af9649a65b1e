// The live operations dashboard: polls /v1/engine/state once a second and
// charts rates (from the cumulative totals) and latency percentiles (from the
// histograms' bucket counts over a sliding window), per model.
import { html } from 'htm/preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import uPlot from 'uplot';
import { getJson } from './api.js';

const POINTS = 180;          // three minutes of history
const WINDOW = 10;           // percentiles over the last 10 polls

// Quantile of the observations between two cumulative bucket snapshots
// (linear within a bucket, as Prometheus' histogram_quantile).
export function windowQuantile(bounds, now, then, q) {
  const cum = now.map((v, i) => v - (then ? then[i] : 0));
  const total = cum[cum.length - 1];
  if (!total) return null;
  const rank = q * total;
  for (let i = 0; i < cum.length; i++) {
    if (cum[i] >= rank) {
      if (i >= bounds.length) return bounds[bounds.length - 1];
      const lo = i === 0 ? 0 : bounds[i - 1];
      const below = i === 0 ? 0 : cum[i - 1];
      const inBucket = cum[i] - below;
      return inBucket ? lo + (bounds[i] - lo) * ((rank - below) / inBucket) : bounds[i];
    }
  }
  return null;
}

function Chart({ id, title, series, data, unit }) {
  const el = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const width = Math.max(280, el.current.clientWidth - 8);
    plot.current = new uPlot({
      width, height: 180,
      scales: { x: { time: true } },
      axes: [{}, { values: (u, v) => v.map((x) => (x == null ? '' : withUnit(x, unit))), size: 64 }],
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 1.5, spanGaps: false }))],
      legend: { live: false },
    }, data, el.current);
    const onResize = () => plot.current.setSize({ width: Math.max(280, el.current.clientWidth - 8), height: 180 });
    window.addEventListener('resize', onResize);
    return () => { window.removeEventListener('resize', onResize); plot.current.destroy(); };
  }, []);
  useEffect(() => { plot.current && plot.current.setData(data); }, [data]);
  const last = data[1].length ? data[1][data[1].length - 1] : null;
  return html`<figure class="card chart" data-chart=${id} data-points=${data[0].length} data-last=${last == null ? '' : last}>
    <figcaption>${title}</figcaption>
    <div ref=${el}></div>
  </figure>`;
}

// Seconds below one are shown in milliseconds.
const withUnit = (x, unit) => (unit === 's' && x < 1 ? `${fmt(x * 1000)} ms` : fmt(x) + (unit ? ` ${unit}` : ''));
const fmt = (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x >= 1 ? x.toFixed(2) : x === 0 ? '0' : x.toPrecision(2));
const pct = (x) => (x == null ? '—' : `${(100 * x).toFixed(1)} %`);

function emptyHistory() {
  return { t: [], gen: [], prompt: [], ttft50: [], ttft99: [], itl50: [], itl99: [], running: [], waiting: [],
    preempt: [], kv: [], hit: [] };
}

export function Dashboard({ onError }) {
  const [state, setState] = useState(null);
  const [hist, setHist] = useState(emptyHistory);
  const [error, setError] = useState('');
  const prev = useRef([]);   // recent states (for rates and windows)

  useEffect(() => {
    let live = true;
    const ctl = new AbortController();
    async function poll() {
      try {
        const s = await getJson('/v1/engine/state', ctl.signal);
        if (!live) return;
        s._t = Date.now() / 1000;
        const snaps = prev.current;
        const last = snaps[snaps.length - 1];
        const old = snaps.length >= WINDOW ? snaps[snaps.length - WINDOW] : snaps[0];
        snaps.push(s);
        if (snaps.length > WINDOW + 1) snaps.shift();
        setState(s);
        setError('');
        if (!last) return;
        const dt = s._t - last._t;
        const rate = (f) => Math.max(0, (f(s) - f(last)) / dt);
        const lat = (name, q) => {
          const h = s.latency && s.latency[name];
          const o = old && old.latency && old.latency[name];
          return h ? windowQuantile(h.bounds, h.cumulative, o && o !== h ? o.cumulative : null, q) : null;
        };
        const dq = (s.prefix_cache.query_tokens - last.prefix_cache.query_tokens);
        setHist((h) => {
          const push = (arr, v) => { const a = arr.concat([v]); return a.length > POINTS ? a.slice(a.length - POINTS) : a; };
          return {
            t: push(h.t, s._t),
            gen: push(h.gen, rate((x) => x.totals.generated_tokens)),
            prompt: push(h.prompt, rate((x) => x.totals.prompt_tokens)),
            ttft50: push(h.ttft50, lat('ttft', 0.5)), ttft99: push(h.ttft99, lat('ttft', 0.99)),
            itl50: push(h.itl50, lat('itl', 0.5)), itl99: push(h.itl99, lat('itl', 0.99)),
            running: push(h.running, s.requests.running), waiting: push(h.waiting, s.requests.waiting),
            preempt: push(h.preempt, s.totals.preemptions - last.totals.preemptions),
            kv: push(h.kv, 100 * s.kv_cache.usage_ratio),
            hit: push(h.hit, dq > 0 ? (100 * (s.prefix_cache.hit_tokens - last.prefix_cache.hit_tokens)) / dq : null),
          };
        });
      } catch (e) {
        if (live && e.name !== 'AbortError') setError(e.message);
      }
    }
    poll();
    const timer = setInterval(poll, 1000);
    return () => { live = false; ctl.abort(); clearInterval(timer); };
  }, []);

  useEffect(() => { if (error) onError(`dashboard: ${error}`); }, [error]);
  if (!state) return html`<div class="dashboard"><p class="empty">${error || 'Loading engine state…'}</p></div>`;
  const r = state.requests;
  const kv = state.kv_cache;
  const cfg = state.config || {};
  const build = state.build || {};
  return html`<div class="dashboard">
    <div class="tiles">
      <div class="card tile"><span>Model</span><b data-testid="model-name">${state.model}</b></div>
      <div class="card tile"><span>Running / waiting</span><b>${r.running} / ${r.waiting}</b></div>
      <div class="card tile"><span>KV blocks</span><b>${kv.blocks_used} / ${kv.blocks_total}</b></div>
      <div class="card tile"><span>Prefix-cache hit rate</span><b>${pct(state.prefix_cache.hit_rate)}</b></div>
      <div class="card tile"><span>Generated tokens</span><b>${state.totals.generated_tokens}</b></div>
      <div class="card tile"><span>Preemptions</span><b>${state.totals.preemptions}</b></div>
    </div>
    <div class="charts">
      <${Chart} id="tokens" title=${`Tokens/s · ${state.model}`} data=${[hist.t, hist.gen, hist.prompt]}
        series=${[{ label: 'generated', color: '#2563eb' }, { label: 'prompt', color: '#16a34a' }]} />
      <${Chart} id="ttft" title="Time to first token (10 s window)" unit="s" data=${[hist.t, hist.ttft50, hist.ttft99]}
        series=${[{ label: 'p50', color: '#2563eb' }, { label: 'p99', color: '#dc2626' }]} />
      <${Chart} id="itl" title="Inter-token latency (10 s window)" unit="s" data=${[hist.t, hist.itl50, hist.itl99]}
        series=${[{ label: 'p50', color: '#2563eb' }, { label: 'p99', color: '#dc2626' }]} />
      <${Chart} id="requests" title="Requests" data=${[hist.t, hist.running, hist.waiting, hist.preempt]}
        series=${[{ label: 'running', color: '#2563eb' }, { label: 'waiting', color: '#d97706' }, { label: 'preemptions/s', color: '#dc2626' }]} />
      <${Chart} id="kv" title="KV cache" unit="%" data=${[hist.t, hist.kv, hist.hit]}
        series=${[{ label: 'blocks used', color: '#7c3aed' }, { label: 'prefix hit', color: '#16a34a' }]} />
    </div>
    <section class="card">
      <h2>In flight (${r.in_flight_total})</h2>
      <table class="inflight" data-testid="inflight">
        <thead><tr><th>id</th><th>tenant</th><th>state</th><th>age</th><th>prompt</th><th>generated</th><th>stream</th></tr></thead>
        <tbody>
          ${r.in_flight.map((j) => html`<tr><td>${j.id}</td><td>${j.tenant}</td><td>${j.phase}</td><td>${j.age_s.toFixed(1)} s</td>
            <td>${j.prompt_tokens}</td><td>${j.completion_tokens}</td><td>${j.stream ? 'yes' : 'no'}</td></tr>`)}
          ${r.in_flight.length === 0 && html`<tr><td colspan="7" class="empty">none</td></tr>`}
        </tbody>
      </table>
    </section>
    <div class="two">
      <section class="card"><h2>Engine configuration</h2>
        <dl>${Object.entries(cfg).map(([k, v]) => html`<dt>${k}</dt><dd>${String(v)}</dd>`)}</dl></section>
      <section class="card"><h2>Build</h2>
        <dl>${Object.entries(build).map(([k, v]) => html`<dt>${k}</dt><dd>${String(v)}</dd>`)}</dl></section>
    </div>
  </div>`;
}
