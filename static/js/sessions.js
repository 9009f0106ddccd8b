// Sessions: the list (status, kind, model, usage, cost; refreshed live) and
// a form for a new one. /ui/sessions/{id} is the chat (chat.js).

import * as api from './api.js';
import { h, icon, pill, put, empty, errorBox, loading, ago, fmtCost, fmtTokens, fmtInt, shortId, field, toast, reconcile } from './ui.js';

export function mount(main, params, ctx) {
  if (params.id) {
    let stop = null;
    let gone = false;
    import('./chat.js').then((m) => { if (!gone) stop = m.mountChat(main, params.id, ctx); });
    return () => { gone = true; stop?.(); };
  }
  return mountList(main, ctx);
}

/** Models seen in session statuses, by session id (the list does not carry them). */
const models = new Map();

function mountList(main, ctx) {
  let sessions = [];
  let nextBefore = null;
  let more = [];
  let error = null;
  let loaded = false;
  const status = h('select', { 'aria-label': 'Filter by status' },
    h('option', { value: '' }, 'Any status'), ['idle', 'running', 'interrupted', 'closed'].map((s) => h('option', { value: s }, s)));
  const kind = h('select', { 'aria-label': 'Filter by kind' },
    h('option', { value: '' }, 'Any kind'), ['agent', 'deliberation', 'pipeline'].map((k) => h('option', { value: k }, k)));
  const runs = h('select', { 'aria-label': 'Filter one-shot runs' },
    h('option', { value: '' }, 'Sessions and runs'), h('option', { value: 'false' }, 'No one-shot runs'), h('option', { value: 'true' }, 'One-shot runs only'));
  const origin = h('select', { 'aria-label': 'Filter by origin', testid: 'origin-filter' },
    h('option', { value: '' }, 'Any origin'), h('option', { value: 'conclave' }, 'Made here (no protocol threads)'),
    [['langgraph', 'LangGraph threads'], ['a2a', 'A2A tasks'], ['agui', 'AG-UI threads']].map(([v, t]) => h('option', { value: v }, t)));
  const body = h('div');
  const form = newSessionForm(ctx);
  form.hidden = true;
  const newBtn = h('button', { type: 'button', class: 'primary', testid: 'new-session', 'aria-expanded': 'false', 'aria-controls': 'new-session-form' }, icon('plus', 16), 'New session');
  newBtn.addEventListener('click', () => {
    form.hidden = !form.hidden;
    newBtn.setAttribute('aria-expanded', String(!form.hidden));
    if (!form.hidden) form.querySelector('input,select')?.focus();
  });

  put(main,
    h('div', { class: 'page-head' },
      h('div', { class: 'grow' }, h('h1', null, 'Sessions'), h('p', { class: 'sub' }, 'Agent, deliberation and pipeline sessions of this key, newest first. Live.')),
      h('div', { class: 'filters' }, status, kind, runs, origin), newBtn),
    form,
    h('div', { class: 'card' }, body));

  const draw = () => {
    if (error && !loaded) { put(body, errorBox(error, refresh)); return; }
    if (!loaded) { put(body, loading('Loading sessions…')); return; }
    const all = [...sessions, ...more];
    if (all.length === 0) {
      const filtered = status.value || kind.value || runs.value || origin.value;
      put(body, empty(filtered ? 'No sessions match these filters' : 'No sessions yet',
        filtered ? 'Clear the filters to see every session.' : 'Create one with “New session”, then talk to the agent: it runs tools in a sandbox and streams everything here.',
        filtered ? null : h('button', { type: 'button', class: 'primary', onClick: () => newBtn.click() }, icon('plus', 16), 'New session')));
      return;
    }
    if (table.parentNode?.parentNode !== body || body.firstChild?.classList?.contains('banner') !== !!error) {
      put(body,
        error ? h('div', { class: 'banner warn', role: 'status' }, `Refresh failed: ${error.message}. Showing the last list.`) : null,
        h('div', { class: 'table-wrap' }, table), more$);
    }
    reconcile(tbody, all, (s) => s.session_id, (s) => row(s, ctx), { sig: (s) => JSON.stringify([s.session_name, s.status, s.kind, s.usage, s.updated_at, s.model || models.get(s.session_id)]) });
    more$.hidden = !nextBefore;
  };
  const tbody = h('tbody');
  const table = h('table', { class: 'table' },
    h('thead', null, h('tr', null,
      h('th', null, 'Session'), h('th', null, 'Status'), h('th', { class: 'hide-sm' }, 'Kind'), h('th', { class: 'hide-sm' }, 'Model'),
      h('th', { class: 'num hide-sm' }, 'Turns'), h('th', { class: 'num' }, 'Tokens'), h('th', { class: 'num' }, 'Cost'), h('th', { class: 'hide-sm' }, 'Updated'))),
    tbody);
  const more$ = h('div', { class: 'card-body', style: { textAlign: 'center' }, hidden: true }, h('button', { type: 'button', onClick: () => loadMore() }, 'Load more'));

  const query = (before) => api.qs({ limit: 100, status: status.value, kind: kind.value, ephemeral: runs.value, origin: origin.value, before });
  async function refresh() {
    try {
      const answer = await api.get(`/agent/sessions${query()}`);
      sessions = answer.sessions || [];
      if (!more.length) nextBefore = answer.next_before || null;
      error = null;
      loaded = true;
      fillModels(sessions, draw);
    } catch (e) {
      error = e;
    }
    draw();
  }
  async function loadMore() {
    const before = nextBefore;
    if (!before) return;
    try {
      const answer = await api.get(`/agent/sessions${query(before)}`);
      more = more.concat(answer.sessions || []);
      nextBefore = answer.next_before || null;
      draw();
    } catch (e) { toast(e.message, 'danger'); }
  }
  const onFilter = () => { more = []; loaded = false; draw(); refresh(); };
  status.addEventListener('change', onFilter);
  kind.addEventListener('change', onFilter);
  runs.addEventListener('change', onFilter);
  origin.addEventListener('change', onFilter);
  draw();
  const stop = api.poll(refresh, 3000);
  return () => stop();
}

function row(s, ctx) {
  const u = s.usage || {};
  const model = s.model || models.get(s.session_id);
  const href = `/ui/sessions/${s.session_id}`;
  const tr = h('tr', { class: 'clickable', testid: 'session-row', dataset: { sessionId: s.session_id, status: s.status } },
    h('td', { class: 'title-cell' }, h('a', { href }, s.session_name || `Session ${shortId(s.session_id)}`), s.session_name ? h('div', { class: 'id' }, shortId(s.session_id)) : null),
    h('td', null, pill(s.status)),
    h('td', { class: 'hide-sm' }, h('span', { class: 'tag' }, s.kind), s.origin ? h('span', { class: 'tag', title: `Made through ${s.origin}` }, s.origin) : null),
    h('td', { class: 'hide-sm mono small' }, model || h('span', { class: 'muted' }, '—')),
    h('td', { class: 'num hide-sm' }, fmtInt(u.turns)),
    h('td', { class: 'num', title: `${fmtInt(u.input_tokens)} in, ${fmtInt(u.output_tokens)} out` }, `${fmtTokens(u.input_tokens)} / ${fmtTokens(u.output_tokens)}`),
    h('td', { class: 'num' }, fmtCost(u.cost_usd)),
    h('td', { class: 'hide-sm muted' }, ago(s.updated_at)));
  tr.addEventListener('click', (e) => { if (!e.target.closest('a,button')) ctx.navigate(href); });
  return tr;
}

/** Looks up the models of the first sessions the list shows (a few at a time). */
let filling = false;
async function fillModels(list, redraw) {
  if (filling) return;
  const wanted = list.filter((s) => !s.model && !models.has(s.session_id) && s.kind === 'agent').slice(0, 12);
  if (!wanted.length) return;
  filling = true;
  try {
    await Promise.all(wanted.map(async (s) => {
      try {
        const st = await api.get(`/agent/session/${s.session_id}/status`);
        models.set(s.session_id, st.model || st.options?.model || '');
      } catch { models.set(s.session_id, ''); }
    }));
  } finally { filling = false; }
  redraw();
}

export function rememberModel(id, model) {
  if (model) models.set(id, model);
}

function newSessionForm(ctx) {
  const name = h('input', { name: 'session_name', placeholder: 'e.g. refactor-parser', autocomplete: 'off', 'aria-label': 'Session name' });
  const kind = h('select', { name: 'kind', 'aria-label': 'Kind' }, h('option', { value: 'agent' }, 'agent'), h('option', { value: 'deliberation' }, 'deliberation'));
  const model = h('input', { name: 'model', list: 'known-models', placeholder: 'server default', autocomplete: 'off', 'aria-label': 'Model' });
  const models = h('datalist', { id: 'known-models' }, h('option', { value: 'demo' }));
  const deltas = h('input', { type: 'checkbox', checked: true, 'aria-label': 'Stream text token by token' });
  const sandbox = h('input', { type: 'checkbox', checked: true, 'aria-label': 'Tools in a sandbox' });
  const agents = h('input', { type: 'number', min: 1, max: 64, value: 3, 'aria-label': 'Agents per task' });
  const aggregate = h('select', { 'aria-label': 'Aggregate' }, ['judge', 'vote', 'none'].map((a) => h('option', { value: a }, a)));
  // Which tool calls wait for a person's decision (the server's default
  // policy when left as it is).
  const permission = h('select', { testid: 'permission-mode', 'aria-label': 'Permission mode' },
    h('option', { value: '' }, 'server default'),
    [['auto', 'auto: run every call'], ['ask', 'ask: approve every call'], ['ask_writes', 'ask_writes: approve calls that change state'], ['plan', 'plan: run only read-only calls']]
      .map(([v, label]) => h('option', { value: v }, label)));
  const agentOnly = h('div', { class: 'stack' },
    h('div', { class: 'row wrap', style: { gap: '16px' } },
      h('label', { class: 'check' }, deltas, 'Stream text as it is written'),
      h('label', { class: 'check' }, sandbox, 'Tools in a sandbox')),
    h('div', { class: 'form-grid' }, field('Permission mode', permission, 'Which tool calls wait for your approval')));
  const delibOnly = h('div', { class: 'form-grid', hidden: true }, field('Agents per task', agents), field('Aggregate', aggregate));
  const err = h('div', { role: 'alert' });
  const create = h('button', { type: 'submit', class: 'primary', testid: 'create-session' }, 'Create session');
  kind.addEventListener('change', () => {
    agentOnly.hidden = kind.value !== 'agent';
    delibOnly.hidden = kind.value !== 'deliberation';
  });
  const form = h('form', { class: 'card new-session', id: 'new-session-form', 'aria-label': 'New session' },
    h('div', { class: 'card-head' }, h('h2', null, 'New session')),
    h('div', { class: 'card-body stack' },
      h('div', { class: 'form-grid' }, field('Name', name), field('Kind', kind), field('Model', model, 'A model or gateway pool')), models,
      agentOnly, delibOnly, err,
      h('div', { class: 'row' }, create, h('span', { class: 'hint' }, 'The session keeps its history; each message is one turn.'))));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    create.disabled = true;
    err.replaceChildren();
    const options = {};
    if (model.value.trim()) options.model = model.value.trim();
    if (kind.value === 'agent') {
      if (deltas.checked) options.text_deltas = true;
      if (!sandbox.checked) options.sandbox_enabled = false;
      if (permission.value) options.permissions = { mode: permission.value };
    } else {
      delete options.model;
      if (model.value.trim()) options.models = [model.value.trim()];
      options.num_agents = Number(agents.value) || 3;
      options.aggregate = aggregate.value;
    }
    const body = { kind: kind.value, options };
    if (name.value.trim()) body.session_name = name.value.trim();
    try {
      const created = await api.post('/agent/session', body);
      if (options.model) rememberModel(created.session_id, options.model);
      ctx.navigate(`/ui/sessions/${created.session_id}`);
    } catch (e2) {
      err.replaceChildren(errorBox(e2));
      create.disabled = false;
    }
  });
  api.get('/v1/models').then((m) => {
    for (const p of m?.data || []) models.append(h('option', { value: p.id }));
  }).catch(() => {});
  return form;
}
