// Sandboxes: the live ones with their backend, session, CPU, memory, pids
// and age; destroy one (its session gets a fresh one at its next tool call).

import * as api from './api.js';
import { h, pill, put, empty, errorBox, loading, fmtAgo, fmtBytes, shortId, toast, confirmButton } from './ui.js';

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
    put(body, h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
      h('thead', null, h('tr', null, h('th', null, 'Sandbox'), h('th', null, 'Kind'), h('th', { class: 'hide-sm' }, 'Backend'), h('th', null, 'Session'),
        h('th', { class: 'num' }, 'CPU'), h('th', { class: 'num' }, 'Memory'), h('th', { class: 'num hide-sm' }, 'PIDs'), h('th', { class: 'hide-sm' }, 'Age'), h('th', { class: 'hide-sm' }, 'Expires'),
        h('th', null, h('span', { class: 'sr-only' }, 'Actions')))),
      h('tbody', null, list.map((sb) => h('tr', { testid: 'sandbox-row', dataset: { sandbox: sb.id, session: sb.session_id || '' } },
        h('td', { class: 'mono small', title: sb.id }, shortId(sb.id, 12)),
        h('td', null, pill(sb.kind, undefined)),
        h('td', { class: 'hide-sm' }, h('span', { class: 'tag' }, sb.backend)),
        h('td', null, sb.session_id ? h('a', { class: 'mono small', href: `/ui/sessions/${sb.session_id}` }, shortId(sb.session_id)) : h('span', { class: 'muted' }, '—')),
        h('td', { class: 'num' }, sb.cpu_percent === null || sb.cpu_percent === undefined ? h('span', { class: 'muted', title: 'the backend cannot tell' }, '—') : `${Number(sb.cpu_percent).toFixed(1)} %`),
        h('td', { class: 'num' }, sb.memory_bytes === null || sb.memory_bytes === undefined ? h('span', { class: 'muted', title: 'the backend cannot tell' }, '—') : fmtBytes(sb.memory_bytes)),
        h('td', { class: 'num hide-sm' }, sb.pids === null || sb.pids === undefined ? h('span', { class: 'muted' }, '—') : String(sb.pids)),
        h('td', { class: 'hide-sm muted', title: sb.created_at || '' }, sb.created_at ? fmtAgo(sb.created_at).replace(' ago', '') : '—'),
        h('td', { class: 'hide-sm muted', title: sb.expires_at || '' }, sb.expires_at ? fmtAgo(sb.expires_at) : '—'),
        h('td', { class: 'actions' }, confirmButton('Destroy', async () => {
          try {
            await api.del(`/sandboxes/${encodeURIComponent(sb.id)}`, {});
            toast(`Sandbox ${shortId(sb.id, 12)} destroyed`, 'ok');
            draw(last.filter((x) => x.id !== sb.id));
          } catch (e) { toast(e.message, 'danger'); }
          refresh();
        }, { testid: 'destroy', 'aria-label': `Destroy sandbox ${shortId(sb.id, 12)}` }))))))));
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
