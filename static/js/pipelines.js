// Pipelines: start a run of a definition; a run's graph with the node
// running now (or waiting for a decision on a tool call, which can be
// given here) and the path taken, its checkpoint history with the state at
// each step (and what changed since the step before), cancel and resume.

import * as api from './api.js';
import { h, icon, pill, put, empty, errorBox, loading, ago, fmtMs, field, toast, jsonLine } from './ui.js';
import { buildGraph, edgeKey } from './graph.js';

const FINAL = new Set(['completed', 'failed', 'cancelled']);

let definitionsCache = null;
async function definitions() {
  if (!definitionsCache) definitionsCache = api.get('/orchestrator/pipelines').then((r) => r.pipelines || []).catch((e) => { definitionsCache = null; throw e; });
  return definitionsCache;
}

export function mount(main, params, ctx) {
  return params.id ? mountRun(main, params.id, ctx) : mountList(main, ctx);
}

function mountList(main, ctx) {
  let alive = true;
  const select = h('select', { testid: 'pipeline-select', 'aria-label': 'Pipeline' });
  const name = h('input', { 'aria-label': 'Connector name', placeholder: 'e.g. stripe', autocomplete: 'off', testid: 'connector-name' });
  const type = h('select', { 'aria-label': 'Connector type' }, h('option', { value: 'source' }, 'source'), h('option', { value: 'destination' }, 'destination'));
  const request = h('textarea', { rows: 3, 'aria-label': 'Request', placeholder: 'What the connector should do', testid: 'pipeline-request' });
  const inputJson = h('textarea', { rows: 3, 'aria-label': 'Input state (JSON)', class: 'mono', value: '{}' });
  const model = h('input', { 'aria-label': 'Model for the nodes', placeholder: 'server default', autocomplete: 'off' });
  const mode = h('select', { 'aria-label': 'Permission mode of the nodes', testid: 'permission-mode' },
    h('option', { value: '' }, 'server default'), ['auto', 'ask', 'ask_writes', 'plan'].map((m) => h('option', { value: m }, m)));
  const delay = h('input', { type: 'number', min: 0, max: 60000, value: 300, 'aria-label': 'Mock delay per node in milliseconds', testid: 'mock-delay' });
  const mockOn = h('input', { type: 'checkbox', 'aria-label': 'Mock agents', testid: 'mock-on' });
  const delayField = field('Mock delay per node (ms)', delay);
  const mockBox = h('div', null,
    h('label', { class: 'check' }, mockOn, ' Mock agents: no model is called, each node answers its happy-path decision'),
    delayField);
  // The delay means something only for mocked nodes.
  const showDelay = () => { delayField.hidden = !mockOn.checked; };
  mockOn.addEventListener('change', showDelay);
  showDelay();
  const connectorFields = h('div', { class: 'form-grid' }, field('Connector name', name), field('Connector type', type));
  const requestField = field('Request', request);
  const genericField = field('Input state (JSON)', inputJson, 'Initial values of state fields');
  const desc = h('p', { class: 'muted small' });
  const err = h('div', { role: 'alert' });
  const start = h('button', { type: 'submit', class: 'primary', testid: 'start-pipeline' }, icon('play', 16), 'Start run');
  const form = h('form', { class: 'card', testid: 'start-form', 'aria-label': 'Start a pipeline run' },
    h('div', { class: 'card-head' }, h('h2', null, 'Start a run')),
    h('div', { class: 'card-body stack' }, field('Pipeline', select), desc, connectorFields, requestField, genericField,
      h('div', { class: 'form-grid' }, field('Model', model), mockBox),
      field('Permission mode', mode, 'ask: each tool call of a node waits for your decision here; plan: only calls that read run'),
      err, h('div', null, start)));
  let defs = [];
  const showFields = () => {
    const d = defs.find((x) => x.name === select.value);
    desc.textContent = d ? `${d.description || ''} ${d.nodes.length} nodes, starts at ${d.start}.` : '';
    const isConnector = d && d.state && 'connector_name' in d.state;
    connectorFields.hidden = !isConnector;
    requestField.hidden = !(d && d.state && 'original_request' in d.state);
    genericField.hidden = !!isConnector;
  };
  select.addEventListener('change', showFields);
  definitions().then((list) => {
    defs = list;
    put(select, list.map((d) => h('option', { value: d.name }, d.name)));
    showFields();
  }).catch((e) => err.replaceChildren(errorBox(e)));
  api.get('/orchestrator/health').then((hl) => {
    // In test mode every run is mocked: the box is ticked for good.
    if (hl?.test_mode) { mockOn.checked = true; mockOn.disabled = true; showDelay(); }
    form.dataset.testMode = String(!!hl?.test_mode);
  }).catch(() => { form.dataset.testMode = 'unknown'; });

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    err.replaceChildren();
    const d = defs.find((x) => x.name === select.value);
    const body = { pipeline: select.value };
    let input = {};
    if (d && 'connector_name' in (d.state || {})) {
      if (name.value.trim()) body.connector_name = name.value.trim();
      body.connector_type = type.value;
    } else {
      try { input = JSON.parse(inputJson.value || '{}'); } catch (e2) { err.replaceChildren(errorBox(new Error(`Input state: ${e2.message}`))); return; }
    }
    if (!requestField.hidden && request.value.trim()) input.original_request = request.value.trim();
    if (Object.keys(input).length) body.input = input;
    if (model.value.trim()) body.model = model.value.trim();
    if (mode.value) body.permissions = { mode: mode.value };
    if (mockOn.checked) body.mock = { delay_ms: Number(delay.value) || 0 };
    start.disabled = true;
    try {
      const started = await api.post('/orchestrator/pipeline/start', body);
      ctx.navigate(`/ui/pipelines/${encodeURIComponent(started.thread_id)}`);
    } catch (e2) {
      err.replaceChildren(errorBox(e2));
      start.disabled = false;
    }
  });

  const list = h('div', null, loading());
  put(main,
    h('div', { class: 'page-head' }, h('div', { class: 'grow' }, h('h1', null, 'Pipelines'), h('p', { class: 'sub' }, 'Graphs of agents with durable checkpoints: start, watch, cancel and resume runs.'))),
    h('div', { class: 'two-col' }, form, h('div', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', null, 'Runs')), list)));

  const refresh = async () => {
    let runs;
    try {
      runs = await api.get('/orchestrator/runs?limit=50').then((r) => r.runs || []);
    } catch (e) {
      put(list, errorBox(e, refresh));
      return;
    }
    if (!alive) return;
    if (!runs.length) {
      put(list, empty('No runs yet', 'Pick a pipeline and start a run: its graph lights up node by node as it goes.'));
      return;
    }
    put(list, h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
      h('thead', null, h('tr', null, h('th', null, 'Run'), h('th', null, 'Status'), h('th', { class: 'hide-sm' }, 'Node'), h('th', { class: 'num hide-sm' }, 'Steps'), h('th', { class: 'hide-sm' }, 'Started'))),
      h('tbody', null, runs.map((st) => {
        const href = `/ui/pipelines/${encodeURIComponent(st.thread_id)}`;
        const tr = h('tr', { class: 'clickable', testid: 'run-row', dataset: { thread: st.thread_id } },
          h('td', { class: 'title-cell' }, h('a', { href }, st.thread_id), h('div', { class: 'id' }, st.pipeline || '')),
          h('td', null, pill(st.status)),
          h('td', { class: 'hide-sm mono small' }, st.node || '—',
            st.node_status === 'waiting_approval' ? h('span', { class: 'tag', testid: 'run-waiting' }, 'waiting for approval') : null),
          h('td', { class: 'num hide-sm' }, String(st.steps)),
          h('td', { class: 'hide-sm muted' }, ago(st.started_at)));
        tr.addEventListener('click', (e) => { if (!e.target.closest('a')) ctx.navigate(href); });
        return tr;
      })))));
  };
  const stop = api.poll(refresh, 4000);
  return () => { alive = false; stop(); };
}

function mountRun(main, threadId, ctx) {
  let alive = true;
  let sock = null;
  let status = null;
  let history = [];
  let def = null;
  let graph = null;
  let selected = null; // step number
  let lastSeq = 0;
  // waiting: `${node}/${call_id}` → the call a node's agent waits on.
  const live = { current: null, taken: new Set(), visited: new Set(), decisions: new Map(), waiting: new Map() };
  const enc = encodeURIComponent(threadId);

  const runStatus = h('span', { class: 'pill', testid: 'run-status', role: 'status' }, '…');
  const conn = h('span', { class: 'pill', testid: 'connection', dataset: { state: 'connecting' } }, 'Connecting…');
  const cancel = h('button', { type: 'button', class: 'danger', testid: 'cancel-pipeline', disabled: true, 'aria-label': 'Cancel the run' }, icon('stop', 16), 'Cancel');
  const resume = h('button', { type: 'button', testid: 'resume-pipeline', disabled: true, 'aria-label': 'Resume the run after its last checkpoint' }, icon('play', 16), 'Resume');
  const meta = h('div', { class: 'row wrap small muted' });
  const graphBox = h('div', { class: 'graph-wrap' }, loading('Loading the graph…'));
  const steps = h('ol', { class: 'steps', 'aria-label': 'Checkpoints' });
  const stateBox = h('div', { class: 'card-body', testid: 'step-state', 'aria-live': 'polite' });
  const notice = h('div');
  const waitBox = h('div', { testid: 'waiting-calls', 'aria-live': 'polite' });

  put(main,
    h('a', { href: '/ui/pipelines', class: 'crumb' }, icon('back', 14), 'Pipelines'),
    h('div', { class: 'page-head' }, h('div', { class: 'grow' }, h('h1', { class: 'mono', style: { fontSize: '17px' } }, threadId), meta), runStatus, conn, cancel, resume),
    notice,
    waitBox,
    h('div', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', null, 'Graph'), h('span', { class: 'muted small' }, 'green: the path taken · outlined: running now · amber: waiting for approval · dashed: retry edges')), graphBox),
    h('div', { class: 'run-grid' },
      h('div', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', null, 'History'), h('span', { class: 'muted small' }, 'one checkpoint per node')), steps),
      h('div', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', null, 'State')), stateBox)));
  put(steps, h('li', null, h('div', { class: 'empty', testid: 'empty' }, 'No checkpoint yet: the first node is working.')));
  put(stateBox, h('p', { class: 'muted' }, 'Pick a step in the history to see the state after it.'));

  const marks = () => {
    const visited = new Set(live.visited);
    const taken = new Set(live.taken);
    const decisions = new Map(live.decisions);
    const visits = new Map();
    for (const st of history) {
      if (st.node === '(end)') continue;
      visited.add(st.node);
      visits.set(st.node, (visits.get(st.node) || 0) + 1);
      if (st.decision) decisions.set(st.node, st.decision);
      if (st.next && st.status === 'running') taken.add(edgeKey(st.node, st.next));
    }
    const running = status?.status === 'running' || status?.status === 'queued';
    const current = running ? (live.current || status?.node || null) : null;
    if (current) visited.add(current);
    const failed = status?.status === 'failed' ? (history.filter((x) => x.node !== '(end)').pop()?.node || null) : null;
    const sel = history.find((x) => x.step === selected)?.node;
    // Where a stopped run resumes.
    const last = history[history.length - 1];
    const resumeAt = !running && last && last.node === '(end)' ? last.next : null;
    const waiting = new Set(running ? [...live.waiting.values()].map((w) => w.node) : []);
    return { current, visited, taken, decisions, visits, waiting, failed: failed && !running ? failed : null, selected: sel, resumeAt };
  };
  const drawGraph = () => { if (graph) graph.update(marks()); };

  // The steps' own times, as their checkpoints record them; the run's
  // wall time runs on while it does (it includes the waits between steps,
  // approvals and a stop before a resume).
  const stepTime = () => history.reduce((sum, x) => sum + (x.duration_ms || 0), 0);
  const wallTime = (st) => (st === 'running' || st === 'queued')
    ? Math.max(0, Date.now() - Date.parse(status.started_at))
    : status.duration_ms;
  const drawStatus = () => {
    if (!status) return;
    const st = status.status;
    runStatus.className = `pill ${pill(st).className.replace('pill', '').trim()}`;
    runStatus.textContent = st;
    runStatus.dataset.status = st;
    cancel.disabled = !(st === 'running' || st === 'queued');
    resume.disabled = !(st === 'interrupted' || st === 'cancelled' || (st === 'failed' && history.some((x) => x.node === '(end)')));
    put(meta,
      h('span', null, status.pipeline), h('span', null, `· ${status.steps} step${status.steps === 1 ? '' : 's'}`),
      h('span', { testid: 'run-times', title: 'Time the steps took (each checkpoint records its own), then the time since the run started' }, `· ${fmtMs(stepTime())} in steps · ${fmtMs(wallTime(st))} ${st === 'running' || st === 'queued' ? 'so far' : 'in all'}`),
      h('span', null, '· started ', ago(status.started_at)),
      status.session_id ? h('a', { href: `/ui/sessions/${status.session_id}` }, '· event log →') : null);
    const last = history[history.length - 1];
    const resumable = last && last.node === '(end)' && last.next;
    const text = resumable
      ? `Stopped before ${last.next} (${status.reason || st}). Resume continues from there, after step ${history.filter((x) => x.node !== '(end)').length}.`
      : status.reason;
    put(notice, text && st !== 'completed' && st !== 'running' ? h('div', { class: 'banner warn', style: { marginBottom: '12px' } }, icon('alert', 16), text) : null);
  };

  // The calls nodes wait on, each with Allow and Deny: decided through the
  // run's session, which finds the call of its node's agent.
  const decide = async (w, decision, buttons) => {
    buttons.forEach((b) => { b.disabled = true; });
    try {
      await api.post(`/agent/session/${status.session_id}/approvals/${encodeURIComponent(w.call_id)}`, { decision, agent_id: w.node });
      toast(`${decision === 'allow' ? 'Allowed' : 'Denied'} ${w.tool} of ${w.node}`, decision === 'allow' ? 'ok' : '');
    } catch (e) {
      toast(e.message, 'danger');
      buttons.forEach((b) => { b.disabled = false; });
    }
    refresh();
  };
  let waitShown = '';
  const drawWaiting = () => {
    const running = status?.status === 'running';
    const calls = running ? [...live.waiting.values()] : [];
    // Drawn again only when the calls change: a refresh must not replace
    // the buttons under a person's click.
    const shown = JSON.stringify(calls.map((w) => `${w.node}/${w.call_id}`));
    if (shown === waitShown) return;
    waitShown = shown;
    put(waitBox, calls.length ? h('div', { class: 'banner warn stack', style: { marginBottom: '12px', alignItems: 'stretch' } },
      calls.map((w) => {
        const allow = h('button', { type: 'button', class: 'primary', testid: 'approve-call' }, 'Allow');
        const deny = h('button', { type: 'button', class: 'danger', testid: 'deny-call' }, 'Deny');
        allow.addEventListener('click', () => decide(w, 'allow', [allow, deny]));
        deny.addEventListener('click', () => decide(w, 'deny', [allow, deny]));
        return h('div', { class: 'row wrap', testid: 'waiting-call', dataset: { node: w.node, call: w.call_id } },
          icon('alert', 16), h('strong', null, w.node), h('span', null, 'waits for approval:'),
          h('span', { class: 'mono small' }, `${w.tool} ${jsonLine(w.input, 200)}`),
          w.reason ? h('span', { class: 'muted small' }, w.reason) : null, h('span', { class: 'grow' }), allow, deny);
      })) : null);
  };

  const drawHistory = () => {
    if (!history.length) return;
    put(steps, history.map((st) => {
      const end = st.node === '(end)';
      const b = h('button', { type: 'button', testid: 'history-step', dataset: { node: st.node, step: st.step }, 'aria-pressed': String(st.step === selected), 'aria-label': `Step ${st.step}: ${st.node}` },
        h('span', { class: 'step-no' }, `#${st.step}`),
        h('span', { class: 'ellipsis' }, h('strong', null, end ? 'stopped' : st.node), st.next ? h('span', { class: 'muted' }, ` → ${st.next}`) : null),
        h('span', { class: 'row' }, st.decision ? h('span', { class: 'tag' }, st.decision) : pill(st.status)));
      b.addEventListener('click', () => select(st.step));
      return h('li', null, b);
    }));
  };

  const select = (step) => {
    selected = step;
    drawHistory();
    drawState();
    drawGraph();
  };

  const drawState = () => {
    const i = history.findIndex((x) => x.step === selected);
    if (i < 0) return;
    const st = history[i];
    const prev = i > 0 ? history[i - 1].state || {} : {};
    const cur = st.state || {};
    const keys = [...new Set([...Object.keys(prev), ...Object.keys(cur)])].sort();
    const changed = keys.filter((k) => JSON.stringify(prev[k]) !== JSON.stringify(cur[k]));
    const showAll = h('input', { type: 'checkbox', 'aria-label': 'Show every field' });
    const table = h('div', { class: 'diff' });
    const drawRows = () => put(table, (showAll.checked ? keys : changed).map((k) => {
      const was = JSON.stringify(prev[k]);
      const is = JSON.stringify(cur[k]);
      const kind = !(k in prev) || prev[k] === null || prev[k] === undefined ? (is === was ? '' : 'added') : was !== is ? 'changed' : '';
      return h('div', { class: `diff-row ${kind}`, dataset: { key: k } }, h('div', { class: 'k' }, k),
        h('div', null, kind === 'changed' && i > 0 ? h('span', { class: 'old' }, jsonLine(prev[k], 400)) : null,
          h('span', { class: kind ? 'new' : '' }, jsonLine(cur[k], 2000))));
    }));
    showAll.addEventListener('change', drawRows);
    drawRows();
    put(stateBox,
      h('div', { class: 'row wrap', style: { marginBottom: '10px' } },
        h('strong', null, `Step ${st.step} · ${st.node}`), st.decision ? h('span', { class: 'tag' }, st.decision) : null,
        st.next ? h('span', { class: 'muted' }, `next: ${st.next}`) : null, st.status !== 'running' ? pill(st.status) : null, h('span', { class: 'muted small' }, fmtMs(st.duration_ms)),
        h('span', { class: 'grow' }), h('label', { class: 'check' }, showAll, 'all fields')),
      h('p', { class: 'muted small', style: { marginBottom: '8px' } }, changed.length ? `${changed.length} field${changed.length === 1 ? '' : 's'} changed ${i > 0 ? `since step ${history[i - 1].step}` : 'from the initial state'}: ${changed.join(', ')}` : 'Nothing changed at this step.'),
      table,
      Object.keys(st.counters || {}).length ? h('p', { class: 'small muted', style: { marginTop: '8px' } }, `counters: ${jsonLine(st.counters)}`) : null,
      st.reason ? h('p', { class: 'small stream-err', style: { marginTop: '8px' } }, st.reason) : null);
  };

  let refreshTimer = null;
  const refresh = () => {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(load, 120);
  };
  async function load() {
    try {
      const [st, hist] = await Promise.all([
        api.get(`/orchestrator/pipeline/status/${enc}`),
        api.get(`/orchestrator/pipeline/history/${enc}`),
      ]);
      if (!alive) return;
      status = st;
      history = hist.history || [];
      // The status is where the waiting calls are known for sure (events
      // may have been missed while the socket reconnected).
      live.waiting = new Map((st.waiting || []).map((w) => [`${w.node}/${w.call_id}`, w]));
      if (!FINAL.has(st.status) && st.status !== 'running' && st.status !== 'queued') live.current = null;
      if (selected === null && history.length && !(st.status === 'running')) selected = history[history.length - 1].step;
      drawStatus();
      drawWaiting();
      drawHistory();
      if (selected !== null) drawState();
      drawGraph();
    } catch (e) {
      if (!alive) return;
      if (e.status === 404) {
        sock?.stop();
        put(main, h('a', { href: '/ui/pipelines', class: 'crumb' }, icon('back', 14), 'Pipelines'), errorBox(new Error(`Run ${threadId} was not found (or belongs to another key).`)));
      } else toast(e.message, 'danger');
    }
  }

  const onEvent = (ev) => {
    if (typeof ev.seq !== 'number' || ev.seq <= lastSeq) return;
    lastSeq = ev.seq;
    switch (ev.type) {
      case 'node_started':
        live.current = ev.node;
        if (status && status.status !== 'running') status.status = 'running';
        drawStatus();
        break;
      case 'node_completed':
        live.visited.add(ev.node);
        live.decisions.set(ev.node, ev.decision);
        if (live.current === ev.node) live.current = null;
        break;
      case 'route':
        live.taken.add(edgeKey(ev.from, ev.to));
        live.current = ev.to;
        break;
      case 'checkpoint':
        refresh();
        break;
      case 'approval_requested':
        if (!ev.agent_id) return;
        live.waiting.set(`${ev.agent_id}/${ev.call_id}`, { node: ev.agent_id, call_id: ev.call_id, tool: ev.tool, input: ev.input, reason: ev.reason });
        drawWaiting();
        break;
      case 'approval_decided':
        if (!ev.agent_id) return;
        live.waiting.delete(`${ev.agent_id}/${ev.call_id}`);
        drawWaiting();
        break;
      case 'pipeline_completed':
      case 'result':
        live.current = null;
        refresh();
        break;
      default:
        return;
    }
    drawGraph();
  };

  Promise.all([api.get(`/orchestrator/pipeline/status/${enc}`), definitions()]).then(([st, defs]) => {
    if (!alive) return;
    status = st;
    def = defs.find((d) => d.name === st.pipeline);
    if (def) {
      graph = buildGraph(def, {
        onNode: (n) => {
          const last = [...history].reverse().find((x) => x.node === n);
          if (last) select(last.step);
        },
      });
      put(graphBox, graph.svg);
    } else {
      put(graphBox, errorBox(new Error(`This server has no definition named ${st.pipeline}.`)));
    }
    drawStatus();
    load();
    sock = new api.LiveSocket({
      path: '/agent/ws',
      params: () => ({ session_id: st.session_id, since: lastSeq }),
      fallback: () => `/agent/session/${st.session_id}/events${api.qs({ since: lastSeq, follow: true })}`,
      check: () => api.get(`/orchestrator/pipeline/status/${enc}`),
      onMessage: onEvent,
      onState: (state, d) => {
        conn.className = 'pill';
        const map = { open: ['connected', 'ok', 'Live'], connecting: ['connecting', 'info', 'Connecting…'], reconnecting: ['reconnecting', 'warn', `Reconnecting in ${Math.ceil((d.inMs || 0) / 1000)}s`], gone: ['gone', 'danger', 'Gone'], closed: ['closed', '', 'Closed'] };
        const [ds, tone, text] = map[state] || map.closed;
        conn.dataset.state = ds;
        if (tone) conn.classList.add(tone);
        conn.textContent = text;
        if (state === 'open') refresh();
      },
    }).start();
  }).catch((e) => {
    if (!alive) return;
    put(main, h('a', { href: '/ui/pipelines', class: 'crumb' }, icon('back', 14), 'Pipelines'),
      errorBox(e.status === 404 ? new Error(`Run ${threadId} was not found (or belongs to another key).`) : e));
  });

  cancel.addEventListener('click', async () => {
    cancel.disabled = true;
    try { await api.post(`/orchestrator/pipeline/cancel/${enc}`, {}); toast('Cancelling…'); } catch (e) { toast(e.message, 'danger'); }
    refresh();
  });
  resume.addEventListener('click', async () => {
    resume.disabled = true;
    try {
      const r = await api.post(`/orchestrator/pipeline/resume/${enc}`, {});
      toast(`Resumed after step ${r.from_step}`, 'ok');
      if (status) status.status = 'running';
      drawStatus();
    } catch (e) { toast(e.message, 'danger'); }
    refresh();
  });
  const stopPoll = api.poll(() => (status && (status.status === 'running' || status.status === 'queued') ? load() : null), 5000);

  return () => {
    alive = false;
    clearTimeout(refreshTimer);
    stopPoll();
    sock?.stop();
  };
}
