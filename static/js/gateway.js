// Gateway: pools and their replicas (state, health, outstanding calls,
// latency and error sparklines, weights version) with drain, pause, resume,
// add and remove; the traces of calls, filtered by session or model.

import * as api from './api.js';
import { h, icon, pill, put, empty, errorBox, loading, fmtMs, fmtInt, fmtTime, field, toast, confirmButton, sparkline, jsonBlock, codeBlock, reconcile } from './ui.js';

const HISTORY = 40;

export function mount(main, params, ctx) {
  let alive = true;
  const samples = new Map(); // replica id → [{requests, failures, latency}]
  const removed = new Map(); // drained replicas that left their pool, kept so they can be added back
  let lastPools = [];
  let traces = [];
  let forbidden = null;

  const poolsBox = h('div', null, loading('Loading pools…'));
  const traceBox = h('div', null, loading('Loading traces…'));
  const sessionFilter = h('input', { testid: 'trace-session', placeholder: 'session id', 'aria-label': 'Filter traces by session id', value: params.search.get('session_id') || '' });
  const modelFilter = h('input', { placeholder: 'pool', 'aria-label': 'Filter traces by pool', value: params.search.get('model') || '' });
  const allBox = h('input', { type: 'checkbox', 'aria-label': "Every key's traces" });

  const addForm = addReplicaForm(() => refresh());
  put(main,
    h('div', { class: 'page-head' }, h('div', { class: 'grow' }, h('h1', null, 'Gateway'), h('p', { class: 'sub' }, 'OpenAI-compatible pools of replicas: state, load, latency and errors, live.'))),
    poolsBox,
    ctx.admin ? addForm : null,
    h('div', { class: 'card', style: { marginTop: '16px' } },
      h('div', { class: 'card-head' }, h('h2', { class: 'grow' }, 'Traces'),
        h('div', { class: 'filters' }, sessionFilter, modelFilter, ctx.admin ? h('label', { class: 'check' }, allBox, 'all keys') : null)),
      traceBox));

  async function act(r, action) {
    try {
      const view = await api.post(`/gateway/replicas/${encodeURIComponent(r.id)}/${action}`, {});
      toast(`${r.id}: ${view.state}`, 'ok');
      if (action === 'drain') removed.set(r.id, { ...r, state: view.state || 'draining' });
      else removed.delete(r.id);
      // Show the answer at once; the next poll confirms it.
      for (const p of lastPools) for (const x of p.replicas) if (x.id === r.id) Object.assign(x, view);
      drawPools();
    } catch (e) { toast(e.message, 'danger'); }
    refresh();
  }

  async function addBack(r) {
    try {
      await api.post('/gateway/replicas', { model: r.pool, url: r.url, id: r.id, ...(r.model && r.model !== r.pool ? { upstream_model: r.model } : {}) });
      removed.delete(r.id);
      toast(`${r.id} added back to ${r.pool}`, 'ok');
    } catch (e) { toast(e.message, 'danger'); }
    refresh();
  }

  const poolList = h('div');
  function drawPools() {
    if (forbidden) {
      put(poolsBox, h('div', { class: 'card' }, empty('Pool administration needs an admin key', `${forbidden.message.charAt(0).toUpperCase()}${forbidden.message.slice(1)}. Your own traces are below.`)));
      return;
    }
    if (!lastPools.length) {
      put(poolsBox, h('div', { class: 'card' }, empty('No gateway pools', 'Add a replica below, or configure [gateway.pools.NAME] replicas = [{id, url}] (or --litellm-config) and restart.')));
      return;
    }
    if (poolList.parentNode !== poolsBox) put(poolsBox, poolList);
    reconcile(poolList, lastPools, (p) => p.model, poolSection, { sig: (p) => p.model, update: (el, p) => el.__update(p) });
  }

  function poolSection(p) {
    const info = h('span', { class: 'row wrap', style: { gap: '8px' } });
    const tbody = h('tbody');
    const section = h('section', { class: 'card pool', testid: 'pool', dataset: { pool: p.model }, 'aria-label': `Pool ${p.model}` },
      h('div', { class: 'card-head' }, h('h2', { class: 'mono' }, p.model), info, h('span', { class: 'grow' }),
        ctx.admin ? confirmButton('Remove pool', async () => {
          try { await api.del(`/gateway/pools/${encodeURIComponent(p.model)}`, {}); toast(`Pool ${p.model} removed`, 'ok'); } catch (e) { toast(e.message, 'danger'); }
          refresh();
        }, { 'aria-label': `Remove pool ${p.model}` }) : null),
      h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
        h('thead', null, h('tr', null, h('th', null, 'Replica'), h('th', null, 'State'), h('th', { class: 'num', title: 'Calls in flight' }, 'In flight'), h('th', { class: 'num hide-sm', title: 'Requests / failures' }, 'Req / fail'),
          h('th', { class: 'num' }, 'Mean'), h('th', { class: 'hide-sm' }, 'Latency'), h('th', { class: 'hide-sm' }, 'Errors'),
          h('th', { class: 'num' }, h('span', { class: 'sr-only' }, 'Actions')))),
        tbody)));
    section.__update = (pool) => {
      const w = pool.weights || {};
      put(info, h('span', { class: 'tag' }, pool.strategy), h('span', { class: 'muted small' }, `${pool.num_retries} retr${pool.num_retries === 1 ? 'y' : 'ies'}`),
        w.paused ? pill('paused for weights', 'warn') : null,
        w.in_flight ? h('span', { class: 'muted small' }, `${w.in_flight} in flight`) : null,
        w.waiting ? h('span', { class: 'muted small' }, `${w.waiting} waiting`) : null,
        h('span', { class: 'muted small' }, '· weights ', h('strong', { class: 'mono' }, w.version === null || w.version === undefined ? '—' : String(w.version))));
      const present = new Set(pool.replicas.map((r) => r.id));
      const ghosts = [...removed.values()].filter((r) => r.pool === pool.model && !present.has(r.id)).map((r) => ({ ...r, ghost: true }));
      reconcile(tbody, [...pool.replicas.map((r) => ({ ...r, pool: pool.model })), ...ghosts], (r) => `${r.ghost ? 'ghost:' : ''}${r.id}`,
        (r) => (r.ghost ? ghostRow(r) : replicaRow(r)),
        { sig: (r) => `${r.ghost}|${r.url}`, update: (el, r) => el.__update?.(r) });
    };
    section.__update(p);
    return section;
  }

  function replicaRow(first) {
    const cells = {
      state: h('div', { class: 'row' }), outstanding: h('td', { class: 'num' }), requests: h('td', { class: 'num hide-sm' }),
      mean: h('td', { class: 'num' }), lat: h('td', { class: 'hide-sm' }), err: h('td', { class: 'hide-sm' }), weights: h('div', { class: 'muted small' }),
    };
    let current = first;
    const btn = (action, label, hint) => h('button', { type: 'button', class: 'sm', testid: action, title: hint, 'aria-label': `${label} ${first.id}`, onClick: () => act(current, action) }, label);
    const buttons = ctx.admin ? {
      drain: btn('drain', 'Drain', 'No new calls; it leaves the pool once its calls end'),
      pause: btn('pause', 'Pause', 'No new calls until resumed'),
      resume: btn('resume', 'Resume', 'Take calls again'),
    } : null;
    const tr = h('tr', { testid: 'replica-row', dataset: { replica: first.id, pool: first.pool } },
      h('td', { class: 'title-cell' }, h('span', { class: 'mono' }, first.id), h('div', { class: 'id ellipsis', style: { maxWidth: '180px' }, title: first.url }, first.url)),
      h('td', null, cells.state, cells.weights), cells.outstanding, cells.requests, cells.mean, cells.lat, cells.err,
      h('td', { class: 'actions' }, buttons ? [buttons.drain, buttons.pause, buttons.resume,
        confirmButton('Remove', async () => {
          try { await api.del(`/gateway/replicas/${encodeURIComponent(first.id)}`, {}); toast(`${first.id} removed`, 'ok'); } catch (e) { toast(e.message, 'danger'); }
          refresh();
        }, { class: 'sm ghost', 'aria-label': `Remove ${first.id}`, testid: 'remove', title: 'Remove from the pool now' })] : null));
    tr.__update = (r) => {
      current = r;
      const hist = samples.get(r.id) || [];
      const lat = latencies(r.id);
      const errs = hist.map((x, i) => (i === 0 ? null : Math.max(0, x.failures - hist[i - 1].failures)));
      tr.dataset.state = r.state;
      put(cells.state, pill(r.state), !r.healthy ? pill('unhealthy', 'danger') : r.cooling_down ? pill('cooling down', 'warn') : null);
      cells.outstanding.textContent = fmtInt(r.outstanding);
      cells.requests.textContent = `${fmtInt(r.requests)} / ${fmtInt(r.failures)}`;
      cells.mean.textContent = r.mean_latency_ms === null || r.mean_latency_ms === undefined ? '—' : fmtMs(r.mean_latency_ms);
      put(cells.lat, sparkline(lat, { kind: 'latency', label: `Latency of the last ${lat.filter((x) => x !== null).length} calls to ${r.id}` }));
      put(cells.err, sparkline(errs, { kind: 'errors', label: `Failures of ${r.id} per refresh` }));
      cells.weights.textContent = r.weights_version === null || r.weights_version === undefined ? '' : `weights ${r.weights_version}`;
      if (buttons) {
        // Only what the state allows; the others would do nothing.
        buttons.drain.hidden = !(r.state === 'active' || r.state === 'paused');
        buttons.pause.hidden = r.state !== 'active';
        buttons.resume.hidden = r.state === 'active';
      }
    };
    tr.__update(first);
    return tr;
  }

  function ghostRow(r) {
    return h('tr', { class: 'removed', testid: 'replica-row', dataset: { replica: r.id, state: 'removed', pool: r.pool } },
      h('td', { class: 'title-cell' }, h('span', { class: 'mono' }, r.id), h('div', { class: 'id' }, r.url)),
      h('td', { colspan: 6 }, h('div', { class: 'row' }, pill('drained', 'warn'), h('span', { class: 'muted small' }, 'Drained: the gateway took it out of the pool once its calls ended.'))),
      h('td', { class: 'actions' },
        ctx.admin ? h('button', { type: 'button', class: 'sm', testid: 'resume', 'aria-label': `Add ${r.id} back to ${r.pool}`, onClick: () => addBack(r) }, icon('play', 14), 'Add back') : null,
        h('button', { type: 'button', class: 'sm ghost', 'aria-label': `Forget ${r.id}`, onClick: () => { removed.delete(r.id); drawPools(); } }, 'Dismiss')));
  }

  function latencies(id) {
    const mine = traces.filter((t) => t.replica === id).slice(0, HISTORY).reverse();
    if (mine.length) return mine.map((t) => t.latency_ms);
    // No traces to read: the change of the mean between refreshes.
    const hist = samples.get(id) || [];
    return hist.map((x, i) => {
      if (i === 0) return null;
      const a = hist[i - 1];
      const n = x.requests - a.requests;
      if (n <= 0 || x.latency === null || a.latency === null) return null;
      return Math.max(0, (x.latency * x.requests - a.latency * a.requests) / n);
    });
  }

  const traceTable = h('table', { class: 'table' },
    h('thead', null, h('tr', null, h('th', null, 'Time'), h('th', null, 'Pool'), h('th', null, 'Replica'), h('th', null, 'Status'), h('th', { class: 'num' }, 'Latency'),
      h('th', { class: 'num hide-sm' }, 'TTFT'), h('th', { class: 'num hide-sm' }, 'Retries'), h('th', { class: 'num hide-sm' }, 'Tokens in/out'), h('th', { class: 'hide-sm' }, 'Session'))));
  function drawTraces() {
    if (!traces.length) {
      put(traceBox, empty('No traces', sessionFilter.value ? 'No calls of this session went through the gateway.' : 'Calls through /v1/chat/completions and /v1/completions appear here.'));
      return;
    }
    if (traceTable.parentNode?.parentNode !== traceBox) put(traceBox, h('div', { class: 'table-wrap' }, traceTable));
    // One <tbody> per trace (its row and its folded details), kept across refreshes.
    reconcile(traceTable, traces.slice(0, 100), (t) => t.id, traceBody, { sig: (t) => t.id });
  }

  function traceBody(t) {
    let detail = null;
    const tr = h('tr', { class: 'clickable', testid: 'trace-row', dataset: { session: t.session_id || '' }, tabindex: '0', 'aria-expanded': 'false' },
      h('td', { class: 'mono small' }, fmtTime(t.ts)),
      h('td', { class: 'mono small' }, t.model),
      h('td', { class: 'mono small' }, t.replica || '—'),
      h('td', null, pill(t.status === 'ok' ? 'success' : t.status === 'error' ? 'error' : t.status), t.http_status ? h('span', { class: 'muted small' }, ` ${t.http_status}`) : null),
      h('td', { class: 'num' }, fmtMs(t.latency_ms)),
      h('td', { class: 'num hide-sm' }, t.ttft_ms === null || t.ttft_ms === undefined ? '—' : fmtMs(t.ttft_ms)),
      h('td', { class: 'num hide-sm' }, String(t.retries ?? 0)),
      h('td', { class: 'num hide-sm' }, t.usage ? `${t.usage.prompt_tokens ?? '?'} / ${t.usage.completion_tokens ?? '?'}` : '—'),
      h('td', { class: 'hide-sm' }, t.session_id ? h('a', { href: `/ui/sessions/${t.session_id}`, class: 'mono small' }, t.session_id.slice(0, 8)) : '—'));
    const body = h('tbody', null, tr);
    const toggle = () => {
      if (!detail) {
        detail = h('tr', { class: 'trace-detail' }, h('td', { colspan: 9 }, h('div', { class: 'stack' },
          t.error ? h('div', { class: 'stream-err' }, t.error) : null,
          h('div', null, h('div', { class: 'label muted small' }, 'Request'), jsonBlock(t.request, { lines: 14 })),
          h('div', null, h('div', { class: 'label muted small' }, 'Response'), codeBlock(t.response_text || '', undefined, { lines: 12, wrap: true })),
          t.metadata && Object.keys(t.metadata).length ? h('div', null, h('div', { class: 'label muted small' }, 'Metadata'), jsonBlock(t.metadata, { lines: 8 })) : null)));
        detail.hidden = true;
        body.append(detail);
      }
      detail.hidden = !detail.hidden;
      tr.setAttribute('aria-expanded', String(!detail.hidden));
    };
    tr.addEventListener('click', (e) => { if (!e.target.closest('a')) toggle(); });
    tr.addEventListener('keydown', (e) => { if (e.key === 'Enter') toggle(); });
    return body;
  }

  async function refresh() {
    const q = api.qs({ session_id: sessionFilter.value.trim(), model: modelFilter.value.trim(), limit: 200, all: allBox.checked ? 'true' : '' });
    const [pools, tr] = await Promise.allSettled([api.get('/gateway/replicas'), api.get(`/gateway/traces${q}`)]);
    if (!alive) return;
    if (pools.status === 'fulfilled') {
      forbidden = null;
      lastPools = pools.value.pools || [];
      for (const p of lastPools) {
        for (const r of p.replicas) {
          const list = samples.get(r.id) || [];
          list.push({ requests: r.requests, failures: r.failures, latency: r.mean_latency_ms ?? null });
          if (list.length > HISTORY) list.shift();
          samples.set(r.id, list);
          if (removed.has(r.id)) removed.set(r.id, { ...r, pool: p.model });
        }
      }
    } else if (pools.reason.status === 403) {
      forbidden = pools.reason;
    } else {
      put(poolsBox, errorBox(pools.reason, refresh));
    }
    if (tr.status === 'fulfilled') traces = tr.value.traces || [];
    if (pools.status === 'fulfilled' || forbidden) drawPools();
    if (tr.status === 'fulfilled') drawTraces(); else put(traceBox, errorBox(tr.reason, refresh));
  }

  let debounce = null;
  const onFilter = () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => {
      const url = `/ui/gateway${api.qs({ session_id: sessionFilter.value.trim(), model: modelFilter.value.trim() })}`;
      history.replaceState(null, '', url);
      refresh();
    }, 300);
  };
  sessionFilter.addEventListener('input', onFilter);
  modelFilter.addEventListener('input', onFilter);
  allBox.addEventListener('change', onFilter);
  const stop = api.poll(refresh, 2000);
  return () => { alive = false; clearTimeout(debounce); stop(); };
}

function addReplicaForm(done) {
  const model = h('input', { required: true, placeholder: 'pool, e.g. qwen', 'aria-label': 'Pool', autocomplete: 'off' });
  const url = h('input', { required: true, placeholder: 'http://10.0.0.5:8000', 'aria-label': 'Replica URL', type: 'url', autocomplete: 'off' });
  const id = h('input', { placeholder: 'optional', 'aria-label': 'Replica id', autocomplete: 'off' });
  const upstream = h('input', { placeholder: 'optional', 'aria-label': 'Upstream model', autocomplete: 'off' });
  const err = h('div', { role: 'alert' });
  const submit = h('button', { type: 'submit', class: 'primary' }, icon('plus', 16), 'Add replica');
  const form = h('form', { testid: 'add-replica', 'aria-label': 'Add a replica' },
    h('div', { class: 'card-body stack' },
      h('p', { class: 'muted small' }, 'A new pool is made when none has this name. The URL must pass gateway.allowed_upstreams.'),
      h('div', { class: 'form-grid' }, field('Pool', model), field('URL', url), field('ID', id), field('Upstream model', upstream)),
      err, h('div', null, submit)));
  const box = h('details', { class: 'card', style: { marginTop: '16px' } },
    h('summary', { class: 'card-head', style: { cursor: 'pointer' } }, h('h2', null, 'Add a replica')), form);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    err.replaceChildren();
    submit.disabled = true;
    const body = { model: model.value.trim(), url: url.value.trim() };
    if (id.value.trim()) body.id = id.value.trim();
    if (upstream.value.trim()) body.upstream_model = upstream.value.trim();
    try {
      const view = await api.post('/gateway/replicas', body);
      toast(`Replica ${view.id} added to ${body.model}`, 'ok');
      url.value = '';
      id.value = '';
      done();
    } catch (e2) {
      err.replaceChildren(errorBox(e2));
    }
    submit.disabled = false;
  });
  return box;
}
