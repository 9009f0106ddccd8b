// Sandboxes: the live ones with their backend, session, CPU, memory, pids
// and age; destroy one (its session gets a fresh one at its next tool call).

import * as api from './api.js';
import { h, pill, put, empty, errorBox, loading, fmtAgo, fmtBytes, fmtPercent, shortId, toast, confirmButton, reconcile } from './ui.js';

export function mount(main, params, ctx) {
  let alive = true;
  const all = h('input', { type: 'checkbox', 'aria-label': 'Every sandbox of this server' });
  const body = h('div', null, loading('Loading sandboxes…'));
  const summary = h('span', { class: 'muted small' });
  put(main,
    h('div', { class: 'page-head' },
      h('div', { class: 'grow' }, h('h1', null, 'Sandboxes'), h('p', { class: 'sub' }, 'Where tools run: one per session, made at its first tool call. Live.')),
      summary,
      ctx.admin ? h('label', { class: 'check' }, all, 'All sandboxes (warm pool, MCP scratch)') : null),
    h('div', { class: 'card' }, body));

  let last = [];
  const draw = (list) => {
    last = list;
    summary.textContent = list.length ? `${list.length} live` : '';
    if (!list.length) {
      put(body, empty('No live sandboxes', all.checked
        ? 'This server has no sandbox right now.'
        : 'A session gets a sandbox at its first tool call (a fenced code block or a “$ ” line to the demo model). Idle ones are reclaimed after sandbox.idle_ttl_s.'));
      return;
    }
    if (table.parentNode?.parentNode !== body) put(body, h('div', { class: 'table-wrap' }, table));
    reconcile(tbody, list, (sb) => sb.id, row, { sig: (sb) => `${sb.kind}|${sb.session_id}|${sb.backend}`, update: (el, sb) => el.__update(sb) });
  };

  const tbody = h('tbody');
  const table = h('table', { class: 'table' },
    h('thead', null, h('tr', null, h('th', null, 'Sandbox'), h('th', null, 'Kind'), h('th', { class: 'hide-sm' }, 'Backend'), h('th', null, 'Session'),
      h('th', { class: 'num' }, 'CPU'), h('th', { class: 'num' }, 'Memory'), h('th', { class: 'num hide-sm' }, 'PIDs'), h('th', { class: 'hide-sm' }, 'Age'), h('th', { class: 'hide-sm' }, 'Expires'),
      h('th', null, h('span', { class: 'sr-only' }, 'Actions')))),
    tbody);

  const unknown = () => h('span', { class: 'muted', title: 'the backend cannot tell' }, '—');
  const row = (first) => {
    const cpu = h('td', { class: 'num', testid: 'sandbox-cpu' });
    const mem = h('td', { class: 'num' });
    const pids = h('td', { class: 'num hide-sm' });
    const age = h('td', { class: 'hide-sm muted', title: first.created_at || '' });
    const expires = h('td', { class: 'hide-sm muted', title: first.expires_at || '' });
    const tr = h('tr', { testid: 'sandbox-row', dataset: { sandbox: first.id, session: first.session_id || '' } },
      h('td', { class: 'mono small', title: first.id }, shortId(first.id, 12)),
      h('td', null, pill(first.kind)),
      h('td', { class: 'hide-sm' }, h('span', { class: 'tag' }, first.backend)),
      h('td', null, first.session_id ? h('a', { class: 'mono small', href: `/ui/sessions/${first.session_id}` }, shortId(first.session_id)) : h('span', { class: 'muted' }, '—')),
      cpu, mem, pids, age, expires,
      h('td', { class: 'actions' }, confirmButton('Destroy', async () => {
        try {
          await api.del(`/sandboxes/${encodeURIComponent(first.id)}`, {});
          toast(`Sandbox ${shortId(first.id, 12)} destroyed`, 'ok');
          draw(last.filter((x) => x.id !== first.id));
        } catch (e) { toast(e.message, 'danger'); }
        refresh();
      }, { testid: 'destroy', 'aria-label': `Destroy sandbox ${shortId(first.id, 12)}` })));
    tr.__update = (sb) => {
      put(cpu, sb.cpu_percent === null || sb.cpu_percent === undefined ? unknown() : fmtPercent(sb.cpu_percent));
      put(mem, sb.memory_bytes === null || sb.memory_bytes === undefined ? unknown() : fmtBytes(sb.memory_bytes));
      put(pids, sb.pids === null || sb.pids === undefined ? unknown() : String(sb.pids));
      age.textContent = sb.created_at ? fmtAgo(sb.created_at).replace(' ago', '') : '—';
      expires.textContent = sb.expires_at ? fmtAgo(sb.expires_at) : '—';
    };
    tr.__update(first);
    return tr;
  };

  async function refresh() {
    try {
      const answer = await api.get(`/sandboxes${all.checked ? '?all=true' : ''}`);
      if (!alive) return;
      draw(answer.sandboxes || []);
    } catch (e) {
      if (!alive) return;
      if (e.code === 'no_sandboxes') put(body, empty('This server runs no sandboxes', 'Tools are off: start the server with a sandbox backend (docker, local or kubernetes).'));
      else put(body, errorBox(e, refresh));
    }
  }
  all.addEventListener('change', refresh);
  const stop = api.poll(refresh, 3000);
  return () => { alive = false; stop(); };
}
