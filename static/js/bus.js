// Bus: a live tail of subjects by pattern (over the bus WebSocket), a form
// to publish, and the KV's keys and values, kept current by a watch stream.

import * as api from './api.js';
import { h, icon, pill, put, empty, errorBox, fmtTime, ago, field, toast, jsonBlock, jsonLine, confirmButton } from './ui.js';

const KEEP = 500;

export function mount(main, params, ctx) {
  let alive = true;
  let sock = null;
  let paused = false;
  const seen = new Map(); // subject → last seq shown
  const messages = [];

  const pattern = h('input', { testid: 'pattern-input', value: params.search.get('subjects') || '>', 'aria-label': 'Subject pattern', placeholder: 'e.g. agent.response.*, sync/>', autocomplete: 'off', spellcheck: 'false' });
  const since = h('select', { 'aria-label': 'Start from', style: { width: 'auto' } }, h('option', { value: 'new' }, 'new messages'), h('option', { value: 'all' }, 'all kept messages'));
  const subscribe = h('button', { type: 'submit', class: 'primary', testid: 'subscribe' }, 'Subscribe');
  const pause = h('button', { type: 'button', class: 'sm', 'aria-pressed': 'false' }, icon('pause', 14), 'Pause');
  const clear = h('button', { type: 'button', class: 'sm ghost' }, 'Clear');
  const filter = h('input', { placeholder: 'filter shown messages', 'aria-label': 'Filter shown messages', autocomplete: 'off' });
  const conn = h('span', { class: 'pill', testid: 'connection', dataset: { state: 'closed' } }, 'Not subscribed');
  const tail = h('div', { class: 'tail', role: 'log', 'aria-label': 'Messages', 'aria-live': 'off' });
  const subForm = h('form', { class: 'card-head', 'aria-label': 'Subscribe' },
    h('div', { class: 'grow', style: { minWidth: '160px' } }, pattern), since, subscribe);

  const pubSubject = h('input', { testid: 'publish-subject', 'aria-label': 'Subject to publish on', placeholder: 'e.g. demo.hello', required: true, autocomplete: 'off' });
  const pubData = h('textarea', { testid: 'publish-data', rows: 3, class: 'mono', 'aria-label': 'Payload (JSON)', value: '{"hello": "world"}' });
  const pubErr = h('div', { role: 'alert' });
  const pubForm = h('form', { class: 'card', 'aria-label': 'Publish', style: { marginTop: '16px' } },
    h('div', { class: 'card-head' }, h('h2', null, 'Publish')),
    h('div', { class: 'card-body stack' }, field('Subject', pubSubject), field('Payload (JSON)', pubData), pubErr,
      h('div', null, h('button', { type: 'submit', class: 'primary', testid: 'publish' }, icon('send', 16), 'Publish'))));

  const prefix = h('input', { testid: 'kv-prefix', placeholder: 'key prefix', 'aria-label': 'Key prefix', autocomplete: 'off' });
  const kvBody = h('div');
  const kvConn = h('span', { class: 'muted small' });

  put(main,
    h('div', { class: 'page-head' }, h('div', { class: 'grow' }, h('h1', null, 'Bus'), h('p', { class: 'sub' }, 'Subjects (patterns: * one token, > the rest) and the KV of this key’s namespace.'))),
    h('div', { class: 'bus-grid' },
      h('div', null,
        h('section', { class: 'card', 'aria-label': 'Live tail' },
          subForm,
          h('div', { class: 'card-head' }, conn, h('div', { class: 'grow', style: { minWidth: '140px' } }, filter), pause, clear),
          tail),
        pubForm),
      h('section', { class: 'card', 'aria-label': 'Key-value store' },
        h('div', { class: 'card-head' }, h('h2', null, 'KV'), kvConn, h('div', { class: 'grow' }), h('div', { style: { width: '180px' } }, prefix)),
        kvBody)));

  // ---- tail ----
  const drawEmpty = () => {
    if (!messages.length) put(tail, empty(sock ? `Waiting for messages on ${pattern.value}` : 'Subscribe to a pattern', sock ? 'Messages appear here the moment they are published.' : 'Type a pattern and press Subscribe; > takes every subject.'));
  };
  const matches = (m) => {
    const f = filter.value.trim().toLowerCase();
    return !f || m.subject.toLowerCase().includes(f) || jsonLine(m.data, 2000).toLowerCase().includes(f);
  };
  const msgEl = (m) => {
    const payload = h('div', { class: 'payload json-line', title: 'Show all' }, m.data !== undefined ? jsonLine(m.data, 240) : m.data_base64 ? `base64: ${m.data_base64.slice(0, 120)}` : '');
    const el = h('div', { class: 'msg new', testid: 'bus-message', dataset: { subject: m.subject, seq: m.seq } },
      h('span', { class: 't', title: m.time }, fmtTime(m.time)),
      h('div', { class: 'row' }, h('span', { class: 'subj' }, m.subject), h('span', { class: 'muted small' }, `#${m.seq}`)),
      payload);
    payload.style.cursor = 'pointer';
    payload.addEventListener('click', () => {
      if (payload.dataset.open) { payload.replaceChildren(jsonLine(m.data, 240)); payload.className = 'payload json-line'; delete payload.dataset.open; return; }
      payload.dataset.open = '1';
      payload.className = 'payload';
      payload.replaceChildren(jsonBlock(m.data ?? m.data_base64, { lines: 30 }));
    });
    return el;
  };
  const redraw = () => {
    const shown = messages.filter(matches);
    if (!shown.length) { drawEmpty(); if (messages.length) put(tail, empty('No message matches the filter')); return; }
    put(tail, shown.slice().reverse().map(msgEl));
  };
  const onMessage = (m) => {
    if (m.type === 'lagged') {
      tail.prepend(h('div', { class: 'banner warn', role: 'status' }, `${m.missed} message(s) on ${m.subject} after #${m.since} were missed (a subject the store does not keep).`));
      return;
    }
    if (m.type === 'error') { toast(m.message || m.code, 'danger'); return; }
    if (m.type !== 'message') return;
    const last = seen.get(m.subject) || 0;
    if (m.seq <= last) return;
    seen.set(m.subject, m.seq);
    messages.push(m);
    if (messages.length > KEEP) messages.shift();
    if (paused || !matches(m)) return;
    if (tail.querySelector('[data-testid="empty"]')) tail.replaceChildren();
    tail.prepend(msgEl(m));
    while (tail.childElementCount > KEEP) tail.lastElementChild.remove();
  };

  const start = () => {
    sock?.stop();
    const subjects = pattern.value.split(',').map((x) => x.trim()).filter(Boolean).join(',');
    if (!subjects) { pattern.focus(); return; }
    history.replaceState(null, '', `/ui/bus${api.qs({ subjects })}`);
    let first = true;
    sock = new api.LiveSocket({
      path: '/bus/ws',
      // After a drop, only what is new: kept subjects are deduplicated by seq.
      params: () => ({ subscribe: subjects, since: first ? since.value : 'new' }),
      // Where the socket cannot open, the same subscription as NDJSON.
      fallback: () => `/bus/subscribe${api.qs({ subjects, since: first ? since.value : 'new' })}`,
      onMessage,
      onState: (state, d) => {
        conn.className = 'pill';
        if (state === 'open') { first = false; conn.dataset.state = 'connected'; conn.classList.add('ok'); conn.textContent = `Live · ${subjects}${d.mode === 'http' ? ' (HTTP stream)' : ''}`; }
        else if (state === 'connecting') { conn.dataset.state = 'connecting'; conn.classList.add('info'); conn.textContent = 'Connecting…'; }
        else if (state === 'reconnecting') { conn.dataset.state = 'reconnecting'; conn.classList.add('warn', 'live'); conn.textContent = `Connection lost — reconnecting in ${Math.ceil(d.inMs / 1000)}s`; }
        else { conn.dataset.state = 'closed'; conn.textContent = 'Not subscribed'; }
      },
    }).start();
    subscribe.textContent = 'Resubscribe';
    drawEmpty();
  };
  subForm.addEventListener('submit', (e) => { e.preventDefault(); start(); });
  pause.addEventListener('click', () => {
    paused = !paused;
    pause.setAttribute('aria-pressed', String(paused));
    pause.replaceChildren(icon(paused ? 'play' : 'pause', 14), paused ? 'Resume' : 'Pause');
    if (!paused) redraw();
  });
  clear.addEventListener('click', () => { messages.length = 0; drawEmpty(); });
  filter.addEventListener('input', redraw);
  drawEmpty();

  pubForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    pubErr.replaceChildren();
    let data;
    try { data = JSON.parse(pubData.value); } catch (e2) { pubErr.replaceChildren(errorBox(new Error(`The payload is not JSON: ${e2.message}`))); return; }
    const subject = pubSubject.value.trim().split('/').map(encodeURIComponent).join('/');
    try {
      const r = await api.post(`/bus/publish/${subject}`, data);
      toast(`Published ${r.subject} #${r.seq}`, 'ok');
    } catch (e2) { pubErr.replaceChildren(errorBox(e2)); }
  });

  // ---- KV ----
  const kv = new Map();
  let kvAbort = null;
  const drawKv = () => {
    if (!kv.size) {
      put(kvBody, empty('No keys', prefix.value ? `No key starts with “${prefix.value}”.` : 'Keys written with PUT /kv/{key} (or gRPC KVPut) appear here, and change live.'));
      return;
    }
    const rows = [...kv.values()].sort((a, b) => a.key.localeCompare(b.key)).slice(0, 1000);
    put(kvBody, h('ul', { class: 'kv-list', 'aria-label': 'Keys' }, rows.map((e) => h('li', { class: 'kv-item', testid: 'kv-row', dataset: { key: e.key } },
      h('div', { class: 'row' },
        h('span', { class: 'mono kv-key' }, e.key),
        h('span', { class: 'grow' }),
        h('span', { class: 'muted small nowrap' }, `rev ${e.revision}`, e.updated_at ? ' · ' : '', e.updated_at ? ago(e.updated_at) : null),
        confirmButton('Delete', async () => {
          try { await api.del(`/kv/${e.key.split('/').map(encodeURIComponent).join('/')}?if_revision=${e.revision}`, {}); } catch (err) { toast(err.message, 'danger'); }
        }, { class: 'sm ghost', 'aria-label': `Delete key ${e.key}` })),
      h('div', { class: 'json-line', title: jsonLine(e.value ?? e.value_base64, 2000) }, e.value !== undefined ? jsonLine(e.value, 300) : `base64: ${String(e.value_base64 || '').slice(0, 80)}`)))));
  };
  const watchKv = async () => {
    kvAbort?.abort();
    const controller = new AbortController();
    kvAbort = controller;
    kv.clear();
    let attempt = 0;
    while (alive && !controller.signal.aborted) {
      let drawTimer = null;
      try {
        kvConn.textContent = 'connecting…';
        await api.stream(`/kv${api.qs({ prefix: prefix.value, watch: true })}`, (c) => {
          attempt = 0;
          kvConn.textContent = '';
          kvConn.append(pill('live', 'ok'));
          if (c.type === 'delete') kv.delete(c.key); else kv.set(c.key, c);
          clearTimeout(drawTimer);
          drawTimer = setTimeout(drawKv, 60);
        }, { signal: controller.signal });
        drawKv();
      } catch (e) {
        if (controller.signal.aborted || !alive) return;
        if (e.status && e.status < 500) { put(kvBody, errorBox(e)); kvConn.textContent = ''; return; }
      }
      if (controller.signal.aborted || !alive) return;
      const wait = Math.min(15000, 500 * 2 ** attempt);
      attempt += 1;
      kvConn.textContent = `stream lost — retrying in ${Math.ceil(wait / 1000)}s`;
      await new Promise((r) => setTimeout(r, wait));
    }
  };
  // The watch stream sends nothing while the namespace has no key: show
  // the empty state from a plain listing first.
  const listKv = async () => {
    try {
      const r = await api.get(`/kv${api.qs({ prefix: prefix.value })}`);
      for (const e of r.entries || []) if (!kv.has(e.key)) kv.set(e.key, e);
      drawKv();
    } catch (e) { put(kvBody, errorBox(e)); }
  };
  let prefixTimer = null;
  prefix.addEventListener('input', () => { clearTimeout(prefixTimer); prefixTimer = setTimeout(() => { watchKv(); listKv(); }, 300); });
  watchKv();
  listKv();

  // A live tail from the moment the view opens (every subject unless the URL names some).
  start();

  return () => {
    alive = false;
    sock?.stop();
    kvAbort?.abort();
    clearTimeout(prefixTimer);
  };
}
