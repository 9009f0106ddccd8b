// Tool calls that wait for a person's decision, docked above the composer:
// the tool, its input, why it asks and until when, with Approve, Deny and
// Always (allow the tool for the rest of the session). A decision goes out
// on the session's socket (POST as the fallback); the `approval_decided`
// event — from this page, another client, the hook or the timeout — shows
// the outcome and takes the buttons away. The dock lives outside the
// virtualised log so its buttons keep their focus while the log scrolls.

import * as api from './api.js';
import { h, icon, pill, put, toast, jsonBlock, fmtTime } from './ui.js';
import { toolName } from './events.js';

/** Who decided, as the outcome line says it. */
const BY = {
  user: 'by a person',
  admin: 'by an admin',
  hook: 'by the permission hook',
  timeout: 'by the timeout',
  interrupt: 'because the turn was stopped',
  restart: 'because the server restarted',
};

/** How long a sent decision may go unanswered before its buttons come back. */
const ANSWER_WITHIN_MS = 10000;

function typingIn(el) {
  return el instanceof HTMLElement && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
}

function left(expiresAt) {
  const ms = Date.parse(expiresAt) - Date.now();
  if (Number.isNaN(ms)) return '';
  if (ms <= 0) return 'expired: the server denies it now';
  const s = Math.ceil(ms / 1000);
  const text = s >= 3600 ? `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`
    : `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
  return `expires in ${text} (at ${fmtTime(expiresAt)})`;
}

export class ApprovalDock {
  /**
   * `send(frame)`: true when the socket took the frame; `prompt`: the
   * composer's text box, where focus goes back once nothing waits.
   */
  constructor(sessionId, { send, prompt }) {
    this.sessionId = sessionId;
    this.send = send;
    this.prompt = prompt;
    this.cards = new Map();
    // Decisions sent on the socket and not answered yet, oldest first: the
    // server answers a socket's frames in order, and its error frames name
    // no call.
    this.inflight = [];
    this.el = h('div', { class: 'approvals', role: 'region', 'aria-label': 'Tool calls waiting for a decision', testid: 'approvals', hidden: true });
    this.ticker = setInterval(() => this.tick(), 1000);
  }

  destroy() {
    clearInterval(this.ticker);
    for (const c of this.cards.values()) clearTimeout(c.unanswered);
  }

  /** True while some call waits for a decision. */
  get waiting() {
    return [...this.cards.values()].some((c) => c.state === 'pending' || c.state === 'sending');
  }

  /** An `approval_requested` or `approval_decided` event of the log. */
  seen(ev) {
    if (ev.type === 'approval_requested') this.requested(ev);
    else if (ev.type === 'approval_decided') this.decided(ev);
  }

  requested(ev) {
    const old = this.cards.get(ev.call_id);
    if (old) old.el.remove();
    const c = { id: ev.call_id, ev, state: 'pending' };
    const name = toolName(ev.tool);
    c.expires = h('span', { class: 'muted small', testid: 'approval-expires' }, left(ev.expires_at));
    c.note = h('div', { class: 'small', role: 'status', testid: 'approval-status' });
    const button = (label, cls, testid, keys, title, decision, remember) => h('button', {
      type: 'button', class: `sm ${cls}`.trim(), testid, title, 'aria-keyshortcuts': keys,
      onClick: () => this.decide(c, decision, remember),
    }, label);
    c.allow = button('Approve', 'primary', 'approval-allow', 'y Enter', 'Run this call (y or Enter)', 'allow');
    c.deny = button('Deny', 'danger', 'approval-deny', 'n Escape', 'Do not run it; the model is told (n or Esc)', 'deny');
    c.always = button('Always', '', 'approval-always', 'a', `Run it, and allow ${name} for the rest of this session (a)`, 'allow', 'session');
    c.actions = h('div', { class: 'approval-actions' }, c.allow, c.deny, c.always,
      h('span', { class: 'hint hide-sm' }, h('kbd', null, 'y'), ' approve · ', h('kbd', null, 'n'), ' deny · ', h('kbd', null, 'a'), ' always'));
    c.el = h('div', { class: 'card approval', role: 'group', 'aria-label': `${name} waits for a decision`, testid: 'approval', dataset: { callId: ev.call_id, state: 'pending' } },
      h('div', { class: 'approval-head' }, icon('alert', 15),
        h('strong', { class: 'mono', testid: 'approval-tool', title: ev.tool }, name),
        h('span', { class: 'grow' }, 'waits for your decision'), c.expires),
      h('p', { class: 'approval-reason small', testid: 'approval-reason' }, ev.reason || ''),
      h('div', { class: 'approval-input', testid: 'approval-input' }, jsonBlock(ev.input, { lines: 12 })),
      c.actions, c.note);
    this.cards.set(ev.call_id, c);
    this.el.append(c.el);
    this.el.hidden = false;
    this.settleFocus();
  }

  decided(ev) {
    const c = this.cards.get(ev.call_id);
    if (!c) return;
    const allowed = ev.decision === 'allow';
    this.setState(c, allowed ? 'allowed' : 'denied');
    clearTimeout(c.unanswered);
    c.actions.remove();
    c.expires.remove();
    put(c.note);
    c.el.append(h('div', { class: 'approval-outcome', testid: 'approval-outcome' },
      pill(allowed ? 'approved' : 'denied', allowed ? 'ok' : 'danger'),
      h('span', null, BY[ev.by] || `by ${ev.by}`),
      ev.message ? h('span', { class: 'muted' }, `· ${ev.message}`) : null,
      ev.remembered ? h('span', { class: 'muted', testid: 'approval-remembered' }, `· ${toolName(ev.remembered)} is allowed for the rest of this session`) : null,
      ev.input ? h('span', { class: 'muted' }, '· with an edited input') : null,
      h('span', { class: 'grow' }),
      h('button', { type: 'button', class: 'ghost sm', 'aria-label': `Dismiss the decision on ${toolName(c.ev.tool)}`, onClick: () => this.dismiss(c) }, 'Dismiss')));
    this.settleFocus();
  }

  /**
   * A new turn started: what was decided in the last one leaves the dock
   * (it stays in the log's tool calls).
   */
  clear() {
    for (const c of this.cards.values()) this.dismiss(c);
    this.inflight = [];
  }

  dismiss(c) {
    clearTimeout(c.unanswered);
    c.el.remove();
    this.cards.delete(c.id);
    this.el.hidden = this.cards.size === 0;
  }

  setState(c, state) {
    c.state = state;
    c.el.dataset.state = state;
    for (const b of [c.allow, c.deny, c.always]) b.disabled = state !== 'pending';
  }

  async decide(c, decision, remember) {
    if (c.state !== 'pending') return;
    const body = { decision };
    if (remember) body.remember = remember;
    this.setState(c, 'sending');
    c.note.textContent = decision === 'allow' ? (remember ? 'Sending “always allow”…' : 'Sending the approval…') : 'Sending the denial…';
    // Focus stays in the card, on the button the decision used, so keys
    // keep working for the next call once this one settles.
    if (this.send({ type: 'approval', call_id: c.id, ...body })) {
      this.inflight.push(c.id);
      c.unanswered = setTimeout(() => this.failed(c, 'No answer from the server yet; try again.'), ANSWER_WITHIN_MS);
      return;
    }
    try {
      await api.post(`/agent/session/${this.sessionId}/approvals/${encodeURIComponent(c.id)}`, body);
      this.sent(c, decision);
    } catch (e) {
      this.failed(c, e.message);
      toast(e.message, 'danger');
    }
  }

  sent(c, decision) {
    c.el.dataset.sent = decision;
    if (c.state !== 'sending') return;
    clearTimeout(c.unanswered);
    c.note.textContent = decision === 'allow' ? 'Approval sent; the call runs.' : 'Denial sent; the model is told.';
  }

  failed(c, message) {
    clearTimeout(c.unanswered);
    // An answer that never came must not be taken for a later one.
    const i = this.inflight.indexOf(c.id);
    if (i >= 0) this.inflight.splice(i, 1);
    if (c.state !== 'sending') return;
    this.setState(c, 'pending');
    c.note.textContent = message;
    c.note.classList.add('stream-err');
    c.el.dataset.error = message;
  }

  /**
   * A socket frame that is not a log event: true when it answered a
   * decision this page sent (`approval_sent`, or an error frame such as
   * `not_pending`).
   */
  reply(m) {
    if (m.type === 'approval_sent') {
      const i = this.inflight.indexOf(m.call_id);
      if (i >= 0) this.inflight.splice(i, 1);
      const c = this.cards.get(m.call_id);
      if (c) this.sent(c, m.decision);
      toast(m.decision === 'allow' ? 'Approval sent' : 'Denial sent', 'ok');
      return true;
    }
    if (m.type === 'error' && m.code !== 'session_busy' && this.inflight.length) {
      const c = this.cards.get(this.inflight.shift());
      const message = `${m.code === 'not_pending' ? 'Not waiting any more' : 'Refused'}: ${m.message || m.code}`;
      if (c) this.failed(c, message);
      toast(message, 'danger');
      return true;
    }
    return false;
  }

  tick() {
    for (const c of this.cards.values()) {
      if (c.state === 'pending' || c.state === 'sending') c.expires.textContent = left(c.ev.expires_at);
    }
  }

  firstPending() {
    for (const c of this.cards.values()) if (c.state === 'pending') return c;
    return null;
  }

  /**
   * Puts focus on the first waiting call's Approve button unless the
   * reader is busy elsewhere (typing, or on another control), and back in
   * the composer once nothing waits.
   */
  settleFocus() {
    const active = document.activeElement;
    const inDock = this.el.contains(active);
    const free = !active || active === document.body || inDock
      || (active === this.prompt && !this.prompt.value) || active.closest?.('[data-testid="event-list"]');
    if (!free) return;
    const next = this.firstPending();
    if (next) {
      const card = inDock ? active.closest('[data-testid="approval"]') : null;
      if (!card || this.cards.get(card.dataset.callId)?.state !== 'pending' || active.disabled) next.allow.focus();
    } else if (inDock || active === document.body) {
      this.prompt.focus();
    }
  }

  /**
   * A key press on the page: `y`/Enter approve, `n`/Escape deny, `a`
   * always, for the call whose card has the focus or else the first
   * waiting one; never while the reader types in a field. True when it
   * decided.
   */
  key(e) {
    if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || typingIn(e.target)) return false;
    if (document.querySelector('dialog[open]')) return false;
    const k = e.key;
    if (!['y', 'Y', 'n', 'N', 'a', 'A', 'Enter', 'Escape'].includes(k)) return false;
    // Enter on a button or a link is that control's own click.
    if (k === 'Enter' && e.target instanceof HTMLElement && e.target.closest('button,a,summary')) return false;
    const inCard = e.target instanceof HTMLElement ? e.target.closest('[data-testid="approval"]') : null;
    const c = (inCard && this.cards.get(inCard.dataset.callId)?.state === 'pending') ? this.cards.get(inCard.dataset.callId) : this.firstPending();
    if (!c) return false;
    e.preventDefault();
    const lower = k.toLowerCase();
    if (lower === 'y' || k === 'Enter') this.decide(c, 'allow');
    else if (lower === 'n' || k === 'Escape') this.decide(c, 'deny');
    else this.decide(c, 'allow', 'session');
    return true;
  }
}
