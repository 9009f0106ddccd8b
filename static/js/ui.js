// Small DOM helpers shared by every view: element builders, icons,
// formatting, status pills, empty states, errors, toasts, folded code.

import { highlight, guessLanguage } from './highlight.js';

const SVG_NS = 'http://www.w3.org/2000/svg';

function setProps(el, props, isSvg) {
  if (!props) return;
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.setAttribute('class', v);
    else if (k === 'testid') el.setAttribute('data-testid', v);
    else if (k === 'dataset') for (const [dk, dv] of Object.entries(v)) { if (dv !== undefined && dv !== null) el.dataset[dk] = dv; }
    else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2).toLowerCase(), v);
    else if (!isSvg && (k === 'value' || k === 'checked' || k === 'selected' || k === 'indeterminate')) el[k] = v;
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}

function addChildren(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) addChildren(el, c);
    else if (c instanceof Node) el.append(c);
    else el.append(document.createTextNode(String(c)));
  }
}

/** `h('button', {class, onClick, testid}, 'text', child…)`. */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props, false);
  addChildren(el, children);
  return el;
}

export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setProps(el, props, true);
  addChildren(el, children);
  return el;
}

const ICONS = {
  sessions: 'M4 5h16v10H8l-4 4z',
  deliberations: 'M7 8a3 3 0 1 0 0-.01M17 8a3 3 0 1 0 0-.01M12 17a3 3 0 1 0 0-.01M9.5 9.5l1.5 5M14.5 9.5l-1.5 5M10 8h4',
  pipelines: 'M5 6h4v4H5zM15 14h4v4h-4zM9 8h3a2 2 0 0 1 2 2v4a2 2 0 0 0 2 2',
  gateway: 'M4 6h16M4 12h16M4 18h16M8 4v4M14 10v4M10 16v4',
  sandboxes: 'M12 3l8 4.5v9L12 21l-8-4.5v-9zM12 12l8-4.5M12 12v9M12 12L4 7.5',
  bus: 'M4 12h4l2-6 4 12 2-6h4',
  usage: 'M5 20V11M10 20V5M15 20v-7M20 20V8M3 20h18',
  plus: 'M12 5v14M5 12h14',
  stop: 'M7 7h10v10H7z',
  send: 'M5 12h13M13 6l6 6-6 6',
  back: 'M15 6l-6 6 6 6',
  trash: 'M5 7h14M10 7V5h4v2M7 7l1 12h8l1-12',
  copy: 'M9 9h10v10H9zM5 15V5h10',
  sun: 'M12 4v2M12 18v2M4 12h2M18 12h2M6.3 6.3l1.4 1.4M16.3 16.3l1.4 1.4M6.3 17.7l1.4-1.4M16.3 7.7l1.4-1.4M12 9a3 3 0 1 0 0 6 3 3 0 0 0 0-6',
  moon: 'M20 14.5A8 8 0 0 1 9.5 4 8 8 0 1 0 20 14.5z',
  monitor: 'M4 5h16v11H4zM9 20h6M12 16v4',
  key: 'M14 10a4 4 0 1 0-3.5 4L13 16.5V19h2.5v-2H18v-2.5l-3.2-3.2A4 4 0 0 0 14 10z',
  inbox: 'M4 13l2.5-7h11L20 13v5H4zM4 13h5l1 2h4l1-2h5',
  refresh: 'M19 8a8 8 0 1 0 1 6M19 3v5h-5',
  tool: 'M14 6a4 4 0 0 0 5 5l-8 8-3-3 8-8a4 4 0 0 0-2-2z',
  alert: 'M12 4l9 16H3zM12 10v4M12 17v.5',
  play: 'M8 5l11 7-11 7z',
  pause: 'M8 5h3v14H8zM13 5h3v14h-3z',
  drain: 'M12 4v10M7 10l5 5 5-5M5 20h14',
  keyboard: 'M3 7h18v10H3zM7 11h.01M11 11h.01M15 11h.01M7 14h10',
  fork: 'M6 3v5a4 4 0 0 0 4 4h4a4 4 0 0 0 4-4V3M12 12v9M6 3h.01M18 3h.01',
};

export function icon(name, size = 18) {
  return s('svg', { viewBox: '0 0 24 24', width: size, height: size, fill: 'none', stroke: 'currentColor', 'stroke-width': 1.8, 'stroke-linecap': 'round', 'stroke-linejoin': 'round', 'aria-hidden': 'true', focusable: 'false' },
    s('path', { d: ICONS[name] || ICONS.alert }));
}

// ---------- formatting ----------

// Formatters are made once: making one per call is slow (thousands of events).
const INT = new Intl.NumberFormat('en-US');
const TIME = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
const DATE = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });

export function fmtInt(n) {
  if (n === undefined || n === null) return '—';
  return INT.format(Number(n));
}

export function fmtTokens(n) {
  if (n === undefined || n === null) return '—';
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e4) return `${(n / 1e3).toFixed(1)}k`;
  return fmtInt(n);
}

export function fmtCost(usd, known = true) {
  if (usd === undefined || usd === null) return '—';
  const v = Number(usd);
  const text = v === 0 ? '$0' : v < 0.01 ? `$${v.toFixed(4)}` : `$${v.toFixed(2)}`;
  return known === false ? `${text}+` : text;
}

export function fmtMs(ms) {
  if (ms === undefined || ms === null) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const m = Math.floor(ms / 60000);
  return `${m} min ${Math.round((ms % 60000) / 1000)} s`;
}

/** A percentage to one decimal (`12.3 %`); a backend reports CPU use as a raw float. */
export function fmtPercent(p) {
  if (p === undefined || p === null) return '—';
  return `${Number(p).toFixed(1)} %`;
}

export function fmtBytes(b) {
  if (b === undefined || b === null) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Number(b);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v < 10 && i > 0 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

export function fmtAgo(iso) {
  if (!iso) return '—';
  const t = typeof iso === 'number' ? iso : Date.parse(iso);
  if (Number.isNaN(t)) return '—';
  const d = Math.round((Date.now() - t) / 1000);
  const future = d < 0;
  const a = Math.abs(d);
  const text = a < 5 ? 'just now' : a < 60 ? `${a}s` : a < 3600 ? `${Math.floor(a / 60)}m` : a < 86400 ? `${Math.floor(a / 3600)}h ${Math.floor((a % 3600) / 60)}m` : `${Math.floor(a / 86400)}d`;
  if (text === 'just now') return text;
  return future ? `in ${text}` : `${text} ago`;
}

export function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  return TIME.format(d);
}

export function fmtDate(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '—';
  return DATE.format(d);
}

export function shortId(id, n = 8) {
  if (!id) return '';
  return String(id).slice(0, n);
}

/** A `<time>` that keeps saying how long ago (see startClock). */
export function ago(iso) {
  return h('time', { datetime: iso || '', title: fmtDate(iso), dataset: { ago: '1' } }, fmtAgo(iso));
}

let clock = null;
export function startClock() {
  if (clock) return;
  clock = setInterval(() => {
    for (const t of document.querySelectorAll('time[data-ago]')) t.textContent = fmtAgo(t.getAttribute('datetime'));
  }, 10000);
}

// ---------- status ----------

const TONES = {
  idle: '', running: 'info live', interrupted: 'warn', closed: '', created: '',
  success: 'ok', error: 'danger', max_turns: 'warn', budget_exceeded: 'warn', timed_out: 'warn',
  completed: 'ok', failed: 'danger', cancelled: 'warn', queued: '', pending: '', started: 'info live', resumed: 'info live',
  active: 'ok', draining: 'warn', paused: 'warn', removed: 'danger', unhealthy: 'danger',
  PENDING: 'info live', COMPLETED: 'ok', FAILED: 'danger', SUBMITTED: 'info live',
  connected: 'ok', connecting: 'info live', reconnecting: 'warn live', gone: 'danger', closed_conn: '',
  session: 'accent', pool: '', scratch: '',
};

export function tone(status) {
  return TONES[status] ?? '';
}

export function pill(text, t = tone(text), props = {}) {
  return h('span', { class: `pill ${t}`.trim(), ...props }, String(text ?? '—').replace(/_/g, ' '));
}

// ---------- states ----------

export function empty(title, body, action) {
  return h('div', { class: 'empty', testid: 'empty' }, icon('inbox', 36), h('strong', null, title), body ? h('p', null, body) : null, action || null);
}

export function errorBox(err, retry) {
  const message = err?.message || String(err);
  return h('div', { class: 'error-box', role: 'alert' }, icon('alert'),
    h('div', { class: 'grow' }, h('strong', null, err?.status ? `Error ${err.status}` : 'Error'), ' — ', message),
    retry ? h('button', { class: 'sm', onClick: retry }, 'Retry') : null);
}

export function loading(text = 'Loading…') {
  return h('div', { class: 'empty', role: 'status' }, h('span', { class: 'spinner', 'aria-hidden': 'true' }), text);
}

export function toast(message, t = '') {
  const box = document.getElementById('toasts');
  if (!box) return;
  const el = h('div', { class: `toast ${t}` }, message);
  box.append(el);
  setTimeout(() => el.remove(), t === 'danger' ? 7000 : 3500);
}

/** A destructive button that asks once more before acting. */
export function confirmButton(label, onConfirm, props = {}) {
  let armed = null;
  const btn = h('button', { type: 'button', class: `danger ${props.class || 'sm'}`, ...props, onClick: async () => {
    if (!armed) {
      btn.classList.add('confirming');
      btn.textContent = 'Confirm?';
      armed = setTimeout(() => { armed = null; btn.classList.remove('confirming'); btn.textContent = label; }, 3500);
      return;
    }
    clearTimeout(armed);
    armed = null;
    btn.disabled = true;
    btn.textContent = `${label}…`;
    try { await onConfirm(); } finally { btn.disabled = false; btn.classList.remove('confirming'); btn.textContent = label; }
  } }, label);
  return btn;
}

export function copyButton(text, label = 'Copy') {
  return h('button', { type: 'button', class: 'ghost sm icon', 'aria-label': `${label}`, title: label, onClick: async () => {
    try { await navigator.clipboard.writeText(text); toast('Copied'); } catch { toast('Copy failed', 'danger'); }
  } }, icon('copy', 14));
}

// ---------- code ----------

/** Highlighted code, folded past `lines` lines with a "show all" toggle. */
export function codeBlock(code, lang, { lines = 18, wrap = false, testid } = {}) {
  const text = String(code ?? '');
  const language = lang || guessLanguage(text);
  const all = text.split('\n');
  const pre = h('pre', { class: `code${wrap ? ' wrap' : ''}`, testid, dataset: { lang: language || 'text' } });
  const box = h('div', { class: 'fold' }, pre);
  const tooLong = all.length > lines + 4 || text.length > 6000;
  const render = (full) => {
    let shown = text;
    if (!full && tooLong) {
      shown = all.slice(0, lines).join('\n');
      if (shown.length > 6000) shown = shown.slice(0, 6000);
    }
    pre.replaceChildren(highlight(shown, language));
  };
  render(false);
  if (tooLong) {
    let full = false;
    const toggle = h('button', { type: 'button', class: 'sm fold-toggle', 'aria-expanded': 'false' }, `Show all (${fmtInt(all.length)} lines)`);
    toggle.addEventListener('click', () => {
      full = !full;
      render(full);
      toggle.setAttribute('aria-expanded', String(full));
      toggle.textContent = full ? 'Show less' : `Show all (${fmtInt(all.length)} lines)`;
    });
    box.append(toggle);
  }
  return box;
}

export function jsonBlock(value, opts = {}) {
  let text;
  try { text = JSON.stringify(value, null, 2); } catch { text = String(value); }
  return codeBlock(text ?? 'null', 'json', opts);
}

/** One-line JSON, for tables. */
export function jsonLine(value, max = 160) {
  let text;
  try { text = typeof value === 'string' ? value : JSON.stringify(value); } catch { text = String(value); }
  if (text === undefined) text = '';
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/**
 * Assistant text: plain text with ``` fences shown as highlighted code and
 * `inline` code. Nothing is parsed as HTML.
 */
export function richText(text) {
  const frag = document.createDocumentFragment();
  const src = String(text ?? '').replace(/\\`/g, '`');
  const fence = /```([\w+-]*)\n?([\s\S]*?)(```|$)/g;
  let last = 0;
  let m;
  while ((m = fence.exec(src))) {
    if (m.index > last) frag.append(inlineText(src.slice(last, m.index)));
    frag.append(codeBlock(m[2].replace(/\n$/, ''), m[1] || undefined, { lines: 24 }));
    last = fence.lastIndex;
    if (m[0].length === 0) break;
  }
  if (last < src.length) frag.append(inlineText(src.slice(last)));
  return frag;
}

function inlineText(text) {
  const frag = document.createDocumentFragment();
  const parts = text.split(/(`[^`\n]+`)/g);
  for (const part of parts) {
    if (part.startsWith('`') && part.endsWith('`') && part.length > 2) frag.append(h('code', { class: 'inline' }, part.slice(1, -1)));
    else if (part) frag.append(document.createTextNode(part));
  }
  return frag;
}

// ---------- sparklines ----------

/** An SVG sparkline of `values` (nulls are gaps in time, drawn as 0 for errors). */
export function sparkline(values, { width = 84, height = 24, kind = 'latency', label } = {}) {
  const pts = values.map((v) => (v === null || v === undefined ? null : Number(v)));
  const real = pts.filter((v) => v !== null);
  const svg = s('svg', { class: `spark${kind === 'errors' ? ' err' : ''}`, testid: 'sparkline', dataset: { kind }, width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': label || `${kind}: ${real.length ? `last ${fmtNum(real[real.length - 1])}, max ${fmtNum(Math.max(...real))}` : 'no data yet'}` });
  if (real.length === 0) {
    svg.append(s('line', { x1: 0, x2: width, y1: height - 2, y2: height - 2, stroke: 'currentColor', 'stroke-opacity': 0.2, 'stroke-dasharray': '2 3' }));
    return svg;
  }
  const hi = Math.max(...real);
  const lo = Math.min(...real);
  // Errors from zero; latency over its own range, so a change shows.
  const max = kind === 'errors' ? Math.max(hi, 1) : hi + (hi - lo) * 0.15 + 0.0001;
  const min = kind === 'errors' ? 0 : Math.max(0, lo - (hi - lo) * 0.15 - (hi === lo ? hi * 0.5 : 0));
  if (kind === 'errors' && hi === 0) svg.classList.add('zero');
  const n = Math.max(pts.length - 1, 1);
  const coords = [];
  pts.forEach((v, i) => {
    if (v === null) return;
    const x = (i / n) * (width - 4) + 2;
    const y = height - 3 - ((v - min) / (max - min || 1)) * (height - 6);
    coords.push([x, y]);
  });
  if (coords.length === 1) coords.unshift([2, coords[0][1]]);
  const line = coords.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' ');
  svg.append(s('polygon', { class: 'area', points: `${coords[0][0].toFixed(1)},${height} ${line} ${coords[coords.length - 1][0].toFixed(1)},${height}` }));
  svg.append(s('polyline', { points: line }));
  const [lx, ly] = coords[coords.length - 1];
  svg.append(s('circle', { cx: lx, cy: ly, r: 2 }));
  return svg;
}

function fmtNum(v) {
  return Math.abs(v) >= 100 ? Math.round(v) : Number(v.toFixed(1));
}

/**
 * Brings `parent`'s children in line with `items` without rebuilding what
 * did not change (so focus, open details and armed buttons survive a
 * refresh): a child is kept while `sig(item)` is the same, `update(el,
 * item)` then refreshes its live parts; otherwise `render(item)` replaces it.
 */
export function reconcile(parent, items, keyOf, render, { sig = (x) => JSON.stringify(x), update } = {}) {
  const keyed = (el) => el && el.dataset && el.dataset.key !== undefined;
  const old = new Map();
  for (const el of parent.children) if (keyed(el)) old.set(el.dataset.key, el);
  const final = [];
  for (const item of items) {
    const key = String(keyOf(item));
    const signature = sig(item);
    let el = old.get(key);
    if (!el || el.__sig !== signature) {
      const fresh = render(item);
      fresh.dataset.key = key;
      fresh.__sig = signature;
      if (el) el.replaceWith(fresh);
      el = fresh;
    } else if (update) {
      update(el, item);
    }
    old.delete(key);
    final.push(el);
  }
  for (const el of old.values()) el.remove();
  // Children without a key (a table's head) stay where they are.
  const nextKeyed = (el) => { let n = el; while (n && !keyed(n)) n = n.nextElementSibling; return n; };
  let ref = nextKeyed(parent.firstElementChild);
  for (const el of final) {
    if (el === ref) ref = nextKeyed(el.nextElementSibling);
    else parent.insertBefore(el, ref);
  }
}

/** Replaces the children of `el`. */
export function put(el, ...children) {
  el.replaceChildren();
  addChildren(el, children);
  return el;
}

export function field(labelText, control, hint) {
  return h('label', { class: 'field' }, labelText, control, hint ? h('span', { class: 'hint' }, hint) : null);
}
