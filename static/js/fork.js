// Forks of an agent session in the chat: the Fork button on a finished
// turn (POST /agent/session/{id}/fork at that turn's `result` seq), the
// "Forked from" line a fork's log starts with, and the workspace snapshots
// kept for the session's turn ends (GET /agent/session/{id}/snapshots).

import * as api from './api.js';
import { h, icon, toast, shortId, fmtBytes, ago } from './ui.js';

/** The Fork button of a turn that ended at `seq`; `onFork(seq, button)` acts. */
export function forkButton(seq, onFork) {
  const label = `Fork the session at the end of this turn (seq ${seq})`;
  const btn = h('button', { type: 'button', class: 'sm ghost fork-btn', testid: 'fork', 'aria-label': label, title: label, dataset: { atSeq: seq } },
    icon('fork', 14), 'Fork');
  btn.addEventListener('click', () => onFork(seq, btn));
  return btn;
}

/**
 * Forks session `id` at the turn end `seq` into one new session named
 * after its source, then opens it. A refusal (a turn end whose workspace
 * or history is no longer kept, a session gone) shows as a toast with the
 * server's message, like the chat's other failed calls.
 */
export async function forkAt(id, name, seq, button, navigate) {
  button.disabled = true;
  button.setAttribute('aria-busy', 'true');
  try {
    const made = await api.post(`/agent/session/${id}/fork`, {
      at_seq: seq,
      count: 1,
      session_name: `${name || `Session ${shortId(id)}`} · fork at ${seq}`,
    });
    const to = made?.sessions?.[0]?.session_id;
    toast(`Forked at seq ${made?.at_seq ?? seq}`, 'ok');
    if (to) navigate(`/ui/sessions/${to}`);
  } catch (e) {
    toast(e.message, 'danger');
  } finally {
    button.disabled = false;
    button.removeAttribute('aria-busy');
  }
}

/** What a `forked` event shows: its source as a link, and the turn end. */
export function forkedLine(ev) {
  const from = String(ev.from_session || '');
  return [icon('fork', 14), 'Forked from ',
    h('a', { href: `/ui/sessions/${encodeURIComponent(from)}`, testid: 'forked-source', class: 'mono', title: from }, `session ${shortId(from)}`),
    ` at seq ${ev.at_seq}`];
}

/** The prompts a fork carries from its source, folded. */
export function inheritedPrompts(prompts) {
  if (!prompts.length) return null;
  const n = prompts.length;
  return h('details', { class: 'inherited', testid: 'inherited' },
    h('summary', null, `${n} earlier prompt${n === 1 ? '' : 's'} in its history`),
    h('ol', null, prompts.map((p) => h('li', { testid: 'inherited-prompt', title: p }, p.length > 200 ? `${p.slice(0, 200)}…` : p))));
}

/**
 * The side card of the session's kept workspace snapshots; null when the
 * server runs no sandboxes (404) or keeps none for the session.
 */
export async function snapshotsCard(id) {
  let answer;
  try {
    answer = await api.get(`/agent/session/${id}/snapshots`);
  } catch {
    return null;
  }
  const kept = answer?.snapshots || [];
  if (!kept.length) return null;
  return h('div', { class: 'card side-card', testid: 'snapshots-card' },
    h('h2', null, 'Snapshots'),
    h('p', { class: 'muted small' }, `The workspace at the last ${answer.keep_last} turn ends, which a fork starts from.`),
    h('ul', { class: 'small snapshots' }, kept.map((s) => h('li', { testid: 'snapshot', dataset: { turnEnd: s.seq } },
      h('span', { class: 'mono' }, `seq ${(s.turns?.length ? s.turns : [s.seq]).join(', ')}`),
      ` · ${fmtBytes(s.size_bytes)} · `, ago(s.created_at),
      s.named ? h('span', { class: 'tag' }, 'named') : null))));
}
