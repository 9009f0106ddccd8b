// Deliberations: submit a task to N agents; watch their proposals arrive
// side by side, round by round (critique rounds), then the decision and its
// reasoning. Live from the deliberation session's events.

import * as api from './api.js';
import { h, icon, pill, put, empty, errorBox, loading, ago, fmtMs, field, shortId, codeBlock, richText, toast } from './ui.js';

export function mount(main, params, ctx) {
  return params.id ? mountDetail(main, params.id, ctx) : mountList(main, ctx);
}

function mountList(main, ctx) {
  const task = h('textarea', { testid: 'task-input', rows: 4, required: true, 'aria-label': 'Task', placeholder: 'e.g. Write an iterative factorial in Python and explain its complexity.' });
  const agents = h('input', { type: 'number', testid: 'agents-input', min: 1, max: 1024, value: 3, 'aria-label': 'Number of agents' });
  const rounds = h('input', { type: 'number', testid: 'rounds-input', min: 0, max: 10, value: 1, 'aria-label': 'Critique rounds' });
  const aggregate = h('select', { testid: 'aggregate-input', 'aria-label': 'Aggregate' },
    h('option', { value: 'judge' }, 'judge — a judge picks one'), h('option', { value: 'vote' }, 'vote — the agents vote'), h('option', { value: 'none' }, 'none — keep every proposal'));
  const role = h('input', { value: 'agent', 'aria-label': 'Role', autocomplete: 'off' });
  const modelsIn = h('input', { placeholder: 'server default', 'aria-label': 'Models', autocomplete: 'off' });
  const tools = h('input', { type: 'checkbox', 'aria-label': 'Agents use tools in sandboxes' });
  const err = h('div', { role: 'alert' });
  const submit = h('button', { type: 'submit', class: 'primary', testid: 'submit-deliberation' }, 'Start deliberation');
  const form = h('form', { class: 'card', 'aria-label': 'New deliberation' },
    h('div', { class: 'card-head' }, h('h2', null, 'New deliberation')),
    h('div', { class: 'card-body stack' },
      field('Task', task),
      h('div', { class: 'form-grid' }, field('Agents', agents), field('Critique rounds', rounds), field('Aggregate', aggregate), field('Role', role)),
      field('Models', modelsIn, 'Comma-separated models or gateway pools, spread over the agents'),
      h('label', { class: 'check' }, tools, 'Agents use tools, each in a sandbox of its own'),
      err, h('div', null, submit)));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (!task.value.trim()) { task.focus(); return; }
    submit.disabled = true;
    err.replaceChildren();
    const body = {
      task_description: task.value.trim(),
      num_agents: Number(agents.value) || 3,
      rounds: Number(rounds.value) || 0,
      aggregate: aggregate.value,
      role: role.value.trim() || 'agent',
    };
    const models = modelsIn.value.split(',').map((m) => m.trim()).filter(Boolean);
    if (models.length) body.models = models;
    if (tools.checked) body.tools = true;
    try {
      const started = await api.post('/deliberations', body);
      ctx.navigate(`/ui/deliberations/${started.task_id}`);
    } catch (e2) {
      err.replaceChildren(errorBox(e2));
      submit.disabled = false;
    }
  });
  task.addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); } });

  const list = h('div', null, loading());
  put(main,
    h('div', { class: 'page-head' }, h('div', { class: 'grow' }, h('h1', null, 'Deliberations'), h('p', { class: 'sub' }, 'N agents work on one task in parallel, critique each other, and a judge or a vote decides.'))),
    h('div', { class: 'two-col' }, form, h('div', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', null, 'Recent')), list)));

  const refresh = async () => {
    try {
      const answer = await api.get('/deliberations?limit=50');
      const items = answer.deliberations || [];
      if (!items.length) {
        put(list, empty('No deliberations yet', 'Describe a task and start one: the agents’ proposals appear side by side as they arrive.'));
        return;
      }
      put(list, h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
        h('thead', null, h('tr', null, h('th', null, 'Task'), h('th', null, 'Status'), h('th', { class: 'num' }, 'Agents'), h('th', { class: 'num hide-sm' }, 'Time'), h('th', { class: 'hide-sm' }, 'Started'))),
        h('tbody', null, items.map((d) => {
          const href = `/ui/deliberations/${d.task_id}`;
          const tr = h('tr', { class: 'clickable', testid: 'deliberation-row', dataset: { taskId: d.task_id } },
            h('td', { class: 'title-cell' }, h('a', { href }, clip(d.task_description, 90)), h('div', { class: 'id' }, shortId(d.task_id))),
            h('td', null, pill(d.status)),
            h('td', { class: 'num' }, `${d.successful_responses ?? 0}/${d.total_agents ?? '?'}`),
            h('td', { class: 'num hide-sm' }, fmtMs(d.duration_ms)),
            h('td', { class: 'hide-sm muted' }, ago(d.created_at)));
          tr.addEventListener('click', (e) => { if (!e.target.closest('a')) ctx.navigate(href); });
          return tr;
        })))));
    } catch (e) {
      put(list, errorBox(e, refresh));
    }
  };
  const stop = api.poll(refresh, 4000);
  task.focus();
  return () => stop();
}

function clip(text, n) {
  const t = String(text ?? '');
  return t.length > n ? `${t.slice(0, n)}…` : t;
}

function mountDetail(main, taskId, ctx) {
  let alive = true;
  let sock = null;
  let result = null;
  let lastSeq = 0;
  const rounds = new Map(); // round → {el, grid, cards: Map(agent → card)}
  const state = { started: null, decision: null, completed: null };

  const head = h('div', { class: 'page-head' });
  const statusBox = h('span');
  const conn = h('span', { class: 'pill', testid: 'connection', dataset: { state: 'connecting' } }, 'Connecting…');
  const meta = h('div', { class: 'row wrap small muted' });
  const roundsBox = h('div', { class: 'rounds', 'aria-live': 'polite' });
  const decisionBox = h('div');
  const notes = h('div', { class: 'stack' });
  put(main,
    h('a', { href: '/ui/deliberations', class: 'crumb' }, icon('back', 14), 'Deliberations'),
    head, notes, decisionBox, roundsBox);
  put(head, h('div', { class: 'grow' }, h('h1', null, 'Deliberation ', h('span', { class: 'id' }, shortId(taskId))), meta), statusBox, conn);
  put(roundsBox, loading('Waiting for the agents…'));

  const drawStatus = () => {
    const st = state.completed?.status || result?.status || 'PENDING';
    put(statusBox, pill(st, undefined, { testid: 'deliberation-status', dataset: { status: st } }));
  };
  drawStatus();

  const drawMeta = () => {
    const s = state.started || {};
    const parts = [];
    if (result?.task_description) parts.push(h('span', { class: 'grow', style: { color: 'var(--text)', fontSize: '14px' } }, result.task_description));
    put(meta, h('div', { class: 'stack', style: { gap: '6px', width: '100%' } },
      parts.length ? h('div', { class: 'assistant-text' }, parts) : null,
      h('div', { class: 'row wrap' },
        s.num_agents ? h('span', null, `${s.num_agents} × ${s.role}`) : null,
        s.rounds !== undefined ? h('span', null, `· ${s.rounds} critique round${s.rounds === 1 ? '' : 's'}`) : null,
        s.aggregate ? h('span', null, '· aggregate ', h('strong', null, s.aggregate)) : null,
        result?.session_id ? h('a', { href: `/ui/sessions/${result.session_id}` }, '· full event log →') : null)));
  };

  const round = (n) => {
    let r = rounds.get(n);
    if (r) return r;
    if (rounds.size === 0) roundsBox.replaceChildren();
    const grid = h('div', { class: 'proposals' });
    const el = h('section', { class: 'round', dataset: { round: n }, 'aria-label': `Round ${n}` },
      h('h2', null, n === 0 ? 'Round 0 · proposals' : `Round ${n} · critique`, h('span', { class: 'muted small' }, n === 0 ? 'each agent answers the task' : 'each agent sees the others’ proposals and revises its own')), grid);
    r = { el, grid, cards: new Map() };
    rounds.set(n, r);
    const after = [...rounds.keys()].filter((k) => k > n).sort((a, b) => a - b)[0];
    if (after !== undefined) roundsBox.insertBefore(el, rounds.get(after).el); else roundsBox.append(el);
    return r;
  };

  const card = (n, agent) => {
    const r = round(n);
    let c = r.cards.get(agent);
    if (c) return c;
    c = {
      state: pill('working', 'info live'),
      meta: h('span', { class: 'muted small' }),
      body: h('div', { class: 'card-body muted' }, 'Thinking…'),
      tools: 0,
    };
    c.el = h('article', { class: 'card proposal', testid: 'proposal', dataset: { agent, round: n, status: 'working' }, 'aria-label': `${agent}, round ${n}` },
      h('div', { class: 'card-head' }, h('strong', { class: 'mono small' }, agent), h('span', { class: 'grow' }), c.meta, c.state), c.body);
    // Agents in id order, whatever order they answer in.
    const later = [...r.cards.keys()].filter((k) => k > agent).sort()[0];
    if (later) r.grid.insertBefore(c.el, r.cards.get(later).el); else r.grid.append(c.el);
    r.cards.set(agent, c);
    return c;
  };

  const setCard = (c, status, tone) => {
    const p = pill(status, tone);
    c.state.replaceWith(p);
    c.state = p;
    c.el.dataset.status = status;
  };

  const markChosen = () => {
    const d = state.decision;
    for (const r of rounds.values()) for (const [agent, c] of r.cards) c.el.classList.toggle('chosen', !!d && agent === d.choice);
  };

  const drawDecision = () => {
    const d = state.decision;
    const done = state.completed;
    if (!d) {
      if (done) {
        put(decisionBox, h('div', { class: 'card', style: { marginBottom: '18px' } }, h('div', { class: 'card-body' },
          state.started?.aggregate === 'none' ? 'No aggregation: the proposals above are the result.' : `No decision${done.reason ? ` (${done.reason})` : ''}.`)));
      }
      return;
    }
    const tally = d.votes?.tally || (d.votes && !d.votes.ballots ? d.votes : null);
    const max = tally ? Math.max(1, ...Object.values(tally).map(Number)) : 1;
    put(decisionBox, h('section', { class: 'card decision', testid: 'decision', style: { marginBottom: '18px' }, 'aria-label': 'Decision' },
      h('div', { class: 'card-head' }, h('h2', null, 'Decision'), pill(d.method, 'accent'), h('span', null, 'chose ', h('strong', { class: 'mono' }, d.choice)),
        h('span', { class: 'grow' }), done ? h('span', { class: 'muted small' }, `${done.successful_responses}/${done.total_agents} agents answered · ${fmtMs(done.duration_ms)}`) : null),
      h('div', { class: 'card-body stack' },
        h('div', null, h('h3', null, 'Reasoning'), h('p', { testid: 'decision-reasoning', style: { marginTop: '4px' } }, d.reasoning || '—')),
        tally ? h('div', { class: 'votes' }, h('h3', null, 'Votes'), Object.entries(tally).map(([agent, n]) => h('div', { class: 'vote-bar' },
          h('span', { class: 'mono ellipsis' }, agent), h('span', { class: 'bar' }, h('i', { style: { width: `${(Number(n) / max) * 100}%` } })), h('span', { class: 'num' }, String(n))))) : null,
        chosenProposal(d))));
    markChosen();
  };

  // The chosen proposal, three lines of it until asked for all (its card
  // below is outlined too).
  const chosenProposal = (d) => {
    const text = h('div', { class: 'assistant-text clamp' }, richText(d.content));
    const toggle = h('button', { type: 'button', class: 'sm ghost fold-toggle', 'aria-expanded': 'false' }, 'Show all');
    toggle.addEventListener('click', () => {
      const open = text.classList.toggle('clamp');
      toggle.setAttribute('aria-expanded', String(!open));
      toggle.textContent = open ? 'Show all' : 'Show less';
    });
    return h('div', null, h('h3', null, 'Chosen proposal ', h('span', { class: 'muted small' }, `(${d.choice}, outlined below)`)), text, toggle);
  };

  const onEvent = (ev) => {
    if (typeof ev.seq !== 'number') return;
    if (ev.seq <= lastSeq) return;
    lastSeq = ev.seq;
    switch (ev.type) {
      case 'deliberation_started':
        state.started = ev;
        drawMeta();
        break;
      case 'round_started':
        round(ev.round);
        break;
      case 'agent_started': {
        const c = card(ev.round, ev.agent_id);
        c.meta.textContent = ev.model || '';
        break;
      }
      case 'agent_completed': {
        const c = card(ev.round, ev.agent_id);
        setCard(c, 'done', 'ok');
        c.meta.textContent = [c.meta.textContent.split(' · ')[0], fmtMs(ev.duration_ms)].filter(Boolean).join(' · ');
        c.body.className = 'card-body';
        put(c.body, h('div', { class: 'assistant-text' }, richText(ev.proposal?.content ?? '')));
        break;
      }
      case 'agent_failed': {
        const c = card(ev.round, ev.agent_id);
        setCard(c, 'failed', 'danger');
        c.el.classList.add('failed');
        c.body.className = 'card-body stream-err';
        c.body.textContent = ev.error;
        break;
      }
      case 'tool_use': {
        if (!ev.agent_id) break;
        const r = [...rounds.keys()].sort((a, b) => b - a)[0] ?? 0;
        const c = card(r, ev.agent_id);
        c.tools += 1;
        c.meta.textContent = `${c.tools} tool call${c.tools === 1 ? '' : 's'}`;
        break;
      }
      case 'decision':
        state.decision = ev;
        drawDecision();
        break;
      case 'deliberation_completed':
        state.completed = ev;
        drawStatus();
        drawDecision();
        loadResult();
        break;
      case 'status':
        put(notes, h('div', { class: 'banner info', role: 'status' }, ev.message));
        break;
      case 'result':
        notes.replaceChildren();
        if (ev.status !== 'success') put(notes, h('div', { class: 'banner warn' }, `The deliberation ended: ${ev.status}${ev.result ? ` — ${clip(ev.result, 200)}` : ''}`));
        break;
      default:
        break;
    }
  };

  async function loadResult() {
    try {
      result = await api.get(`/deliberations/${taskId}`);
      if (!alive) return;
      drawMeta();
      drawStatus();
      return result;
    } catch (e) {
      if (!alive) return;
      if (e.status === 404) {
        sock?.stop();
        put(roundsBox, errorBox(new Error(`Deliberation ${taskId} was not found: it may belong to another key, or its ephemeral session has been deleted (agent.ephemeral_retention_s).`)));
        conn.hidden = true;
      } else toast(e.message, 'danger');
      return null;
    }
  }

  loadResult().then((r) => {
    if (!alive || !r) return;
    const session = r.session_id || taskId;
    sock = new api.LiveSocket({
      path: '/agent/ws',
      params: () => ({ session_id: session, since: lastSeq }),
      fallback: () => `/agent/session/${session}/events${api.qs({ since: lastSeq, follow: true })}`,
      check: () => api.get(`/agent/session/${session}/status`),
      onMessage: onEvent,
      onState: (st, d) => {
        conn.className = 'pill';
        const map = { open: ['connected', 'ok', 'Live'], connecting: ['connecting', 'info live', 'Connecting…'], reconnecting: ['reconnecting', 'warn live', `Reconnecting in ${Math.ceil((d.inMs || 0) / 1000)}s`], gone: ['gone', 'danger', 'Gone'], closed: ['closed', '', 'Closed'] };
        const [ds, tone, text] = map[st] || map.closed;
        conn.dataset.state = ds;
        if (tone) conn.classList.add(...tone.split(' '));
        conn.textContent = text;
        if (st === 'gone' && !rounds.size) put(roundsBox, showFromResult(r));
      },
    }).start();
  });

  // An old deliberation whose session is gone: show what the result keeps.
  function showFromResult(r) {
    const box = h('div', { class: 'proposals' });
    for (const a of r.results || []) {
      box.append(h('article', { class: 'card proposal', testid: 'proposal', dataset: { agent: a.agent_id, round: 'final' } },
        h('div', { class: 'card-head' }, h('strong', { class: 'mono small' }, a.agent_id), h('span', { class: 'grow' }), pill(a.status)),
        h('div', { class: 'card-body' }, a.proposal ? codeBlock(a.proposal.content, 'text', { wrap: true, lines: 14 }) : a.error || '')));
    }
    if (r.decision) { state.decision = r.decision; drawDecision(); }
    return box;
  }

  return () => {
    alive = false;
    sock?.stop();
  };
}
