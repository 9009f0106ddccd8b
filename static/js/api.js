// The HTTP side of the dashboard: JSON calls with the bearer key, NDJSON
// streams, single-use tickets for WebSockets, and a socket that reconnects
// with backoff. The key lives in sessionStorage and only ever travels in the
// Authorization header; sockets carry a fresh ticket instead.

const KEY_STORE = 'conclave.key';

export const auth = {
  key: readKey(),
  /** What GET /auth/me answered: {auth, admin}. */
  info: null,
  /** Called when the server refuses the key (401) after sign-in. */
  onUnauthorized: null,
};

function readKey() {
  try { return sessionStorage.getItem(KEY_STORE) || null; } catch { return null; }
}

export function setKey(key, { persist = true } = {}) {
  auth.key = key || null;
  try {
    if (key && persist) sessionStorage.setItem(KEY_STORE, key);
    if (!key) sessionStorage.removeItem(KEY_STORE);
  } catch { /* storage may be off; the key then lasts this page */ }
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(extra) {
  const h = { Accept: 'application/json', ...extra };
  if (auth.key) h.Authorization = `Bearer ${auth.key}`;
  return h;
}

async function errorOf(res) {
  let text = '';
  try { text = await res.text(); } catch { /* body gone */ }
  let body = null;
  try { body = JSON.parse(text); } catch { /* not JSON */ }
  const code = body?.error?.code || `http_${res.status}`;
  const message = body?.error?.message || text.trim() || res.statusText || `HTTP ${res.status}`;
  return new ApiError(res.status, code, message);
}

/**
 * One JSON call. POST, PUT and DELETE always send a JSON body (`{}` when
 * there is nothing to say): the server refuses other content types.
 */
export async function request(method, path, body, opts = {}) {
  const init = { method, headers: headers(opts.headers), signal: opts.signal, credentials: 'same-origin', cache: 'no-store' };
  if (method !== 'GET' && method !== 'HEAD') {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body === undefined ? {} : body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', 'The server cannot be reached. Is it running?');
  }
  if (!res.ok) {
    const err = await errorOf(res);
    if (res.status === 401 && !opts.noAuthHook && auth.onUnauthorized) auth.onUnauthorized(err);
    throw err;
  }
  if (opts.raw) return res;
  if (res.status === 204) return null;
  const text = await res.text();
  if (!text) return null;
  try { return JSON.parse(text); } catch { return text; }
}

export const get = (path, opts) => request('GET', path, undefined, opts);
export const post = (path, body, opts) => request('POST', path, body, opts);
export const put = (path, body, opts) => request('PUT', path, body, opts);
export const del = (path, body, opts) => request('DELETE', path, body, opts);

/** PUT of raw bytes (a file, an archive) as `type`; the JSON answer. */
export async function putRaw(path, body, type) {
  let res;
  try {
    res = await fetch(path, { method: 'PUT', headers: headers({ 'Content-Type': type }), body, credentials: 'same-origin', cache: 'no-store' });
  } catch {
    throw new ApiError(0, 'network', 'The server cannot be reached. Is it running?');
  }
  if (!res.ok) throw await errorOf(res);
  return res.json();
}

export function qs(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

/**
 * Reads an NDJSON response line by line; `onItem` gets each parsed object.
 * Resolves when the stream ends; rejects on a network error (not on abort).
 */
export async function readNdjson(res, onItem, signal) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  const abort = () => reader.cancel().catch(() => {});
  signal?.addEventListener('abort', abort, { once: true });
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl).trim();
        buffer = buffer.slice(nl + 1);
        if (!line) continue;
        let item;
        try { item = JSON.parse(line); } catch { continue; }
        if (onItem(item) === false) { abort(); return; }
      }
    }
  } finally {
    signal?.removeEventListener('abort', abort);
  }
}

/** Opens an NDJSON stream with the key in its header. */
export async function stream(path, onItem, { signal } = {}) {
  const res = await request('GET', path, undefined, { raw: true, signal, headers: { Accept: 'application/x-ndjson' } });
  await readNdjson(res, onItem, signal);
}

/**
 * A single-use ticket for one WebSocket (browsers cannot set headers on
 * one, and the key must never appear in a URL). An older server without
 * /auth/ticket and without keys needs none.
 */
export async function ticket() {
  try {
    const answer = await post('/auth/ticket', {});
    return answer?.ticket || null;
  } catch (e) {
    if (e.status === 404 && !auth.key) return null;
    throw e;
  }
}

export async function openSocket(path, params) {
  const t = await ticket();
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  if (t) q.set('ticket', t);
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return new WebSocket(`${scheme}//${location.host}${path}?${q}`);
}

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];

/**
 * A live connection that comes back by itself. It opens a WebSocket
 * (`path`, `params()` read at each attempt so `since` moves on); after
 * `fallbackAfter` attempts that never opened it switches to an NDJSON
 * stream from `fallback()` when one is given. `onState(state, detail)`:
 * connecting | open | reconnecting {inMs, attempt, reason} | gone {error} | closed.
 */
export class LiveSocket {
  constructor({ path, params, onMessage, onState, fallback, check, fallbackAfter = 3 }) {
    Object.assign(this, { path, params, onMessage, onState, fallback, check, fallbackAfter });
    this.ws = null;
    this.attempt = 0;
    this.neverOpened = 0;
    this.stopped = false;
    this.timer = null;
    this.mode = 'ws';
    this.abort = null;
    this.state = 'idle';
  }

  start() {
    this.stopped = false;
    this.connect();
    return this;
  }

  setState(state, detail = {}) {
    this.state = state;
    this.onState?.(state, { ...detail, mode: this.mode });
  }

  async connect() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.setState('connecting');
    if (this.mode === 'http') return this.connectHttp();
    let ws;
    try {
      ws = await openSocket(this.path, this.params());
    } catch (e) {
      if (e.status === 401) { this.stop(); return; }
      return this.retry(e.message || 'cannot get a ticket');
    }
    if (this.stopped) { ws.close(); return; }
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.attempt = 0;
      this.neverOpened = 0;
      this.setState('open');
    };
    ws.onmessage = (m) => {
      let data;
      try { data = JSON.parse(m.data); } catch { return; }
      this.onMessage(data);
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.stopped) return;
      if (!opened) this.neverOpened += 1;
      const reason = opened ? `connection closed${ev.code && ev.code !== 1006 ? ` (${ev.code})` : ''}` : 'could not connect';
      this.retry(reason);
    };
  }

  async connectHttp() {
    const controller = new AbortController();
    this.abort = controller;
    try {
      const res = await request('GET', this.fallback(), undefined, { raw: true, signal: controller.signal, headers: { Accept: 'application/x-ndjson' } });
      this.attempt = 0;
      this.setState('open');
      await readNdjson(res, (item) => { this.onMessage(item); }, controller.signal);
      if (!this.stopped && !controller.signal.aborted) this.retry('stream ended');
    } catch (e) {
      if (this.stopped || e.name === 'AbortError') return;
      if (e.status === 401) { this.stop(); return; }
      if (e.status === 404) { this.setState('gone', { error: e }); this.stopped = true; return; }
      this.retry(e.message);
    }
  }

  async retry(reason) {
    if (this.stopped) return;
    if (this.check) {
      try { await this.check(); } catch (e) {
        if (e.status === 404 || e.status === 403) { this.stopped = true; this.setState('gone', { error: e }); return; }
      }
    }
    if (this.mode === 'ws' && this.fallback && this.neverOpened >= this.fallbackAfter) {
      this.mode = 'http';
      this.attempt = 0;
    }
    const base = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    const inMs = Math.round(base * (0.8 + Math.random() * 0.4));
    this.attempt += 1;
    this.setState('reconnecting', { inMs, attempt: this.attempt, reason, at: Date.now() + inMs });
    this.timer = setTimeout(() => this.connect(), inMs);
  }

  /** Reconnects now instead of waiting out the backoff. */
  retryNow() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.connect();
  }

  /** Sends a frame on an open WebSocket; false when there is none. */
  send(frame) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(frame));
      return true;
    }
    return false;
  }

  get isOpen() {
    return this.state === 'open';
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    this.abort?.abort();
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      try { ws.close(1000); } catch { /* already closed */ }
    }
    this.setState('closed');
  }
}

/** Polls `fn` every `ms` while the page is visible; returns a stop function. */
export function poll(fn, ms) {
  let timer = null;
  let stopped = false;
  let running = false;
  const tick = async () => {
    if (stopped) return;
    if (!document.hidden && !running) {
      running = true;
      try { await fn(); } catch { /* the view shows its own errors */ }
      running = false;
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  const onVisible = () => { if (!document.hidden && !stopped) { clearTimeout(timer); tick(); } };
  document.addEventListener('visibilitychange', onVisible);
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
    document.removeEventListener('visibilitychange', onVisible);
  };
}
