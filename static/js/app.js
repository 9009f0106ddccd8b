// The dashboard's entry: asks GET /auth/me whether a key is needed, shows
// the key form or the shell (left nav + one view), and routes /ui/... paths
// with the history API. Each view module exports mount(main, params, ctx)
// and returns its cleanup.

import * as api from './api.js';
import { h, icon, put, toast, startClock, errorBox } from './ui.js';

const VIEWS = [
  { id: 'sessions', label: 'Sessions', path: '/ui/sessions', load: () => import('./sessions.js') },
  { id: 'deliberations', label: 'Deliberations', path: '/ui/deliberations', load: () => import('./deliberations.js') },
  { id: 'pipelines', label: 'Pipelines', path: '/ui/pipelines', load: () => import('./pipelines.js') },
  { id: 'gateway', label: 'Gateway', path: '/ui/gateway', load: () => import('./gateway.js') },
  { id: 'sandboxes', label: 'Sandboxes', path: '/ui/sandboxes', load: () => import('./sandboxes.js') },
  { id: 'bus', label: 'Bus', path: '/ui/bus', load: () => import('./bus.js') },
  { id: 'usage', label: 'Usage', path: '/ui/usage', load: () => import('./usage.js') },
];

const root = document.getElementById('root');
let main = null;
let cleanup = null;
let renderToken = 0;

function route(pathname) {
  const parts = pathname.replace(/\/+$/, '').split('/').filter(Boolean);
  if (parts[0] !== 'ui') return null;
  const view = VIEWS.find((v) => v.id === parts[1]);
  if (!view) return null;
  return { view, id: parts[2] ? decodeURIComponent(parts.slice(2).join('/')) : null };
}

export function navigate(path, { replace = false } = {}) {
  if (path === location.pathname + location.search) return;
  if (replace) history.replaceState(null, '', path);
  else history.pushState(null, '', path);
  render();
}

async function render() {
  if (!main) return;
  const r = route(location.pathname);
  if (!r) {
    history.replaceState(null, '', '/ui/sessions');
    return render();
  }
  const token = ++renderToken;
  if (cleanup) { try { cleanup(); } catch (e) { console.error(e); } cleanup = null; }
  for (const a of document.querySelectorAll('.nav-link')) {
    if (a.dataset.view === r.view.id) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = `${r.view.label} · Conclave`;
  main.replaceChildren();
  let mod;
  try {
    mod = await r.view.load();
  } catch (e) {
    put(main, errorBox(new Error(`This view failed to load: ${e.message}`)));
    return;
  }
  if (token !== renderToken) return;
  try {
    cleanup = mod.mount(main, { id: r.id, search: new URLSearchParams(location.search) }, ctx) || null;
  } catch (e) {
    console.error(e);
    put(main, errorBox(e));
  }
  main.focus({ preventScroll: true });
}

const ctx = {
  navigate,
  get admin() { return api.auth.info?.admin !== false; },
  get authOn() { return !!api.auth.info?.auth; },
};

// ---------- theme ----------

const THEMES = ['system', 'light', 'dark'];
function applyTheme(theme) {
  if (theme === 'system') document.documentElement.removeAttribute('data-theme');
  else document.documentElement.setAttribute('data-theme', theme);
}
function currentTheme() {
  try { return localStorage.getItem('conclave.theme') || 'system'; } catch { return 'system'; }
}
applyTheme(currentTheme());

function themeButton() {
  const names = { system: 'monitor', light: 'sun', dark: 'moon' };
  const btn = h('button', { type: 'button', class: 'ghost sm' });
  const show = () => {
    const t = currentTheme();
    btn.replaceChildren(icon(names[t], 14), `Theme: ${t}`);
    btn.setAttribute('aria-label', `Theme: ${t}. Change theme`);
  };
  btn.addEventListener('click', () => {
    const next = THEMES[(THEMES.indexOf(currentTheme()) + 1) % THEMES.length];
    try { localStorage.setItem('conclave.theme', next); } catch { /* private mode */ }
    applyTheme(next);
    show();
  });
  show();
  return btn;
}

// ---------- shell ----------

function logo(size = 26) {
  const svgNS = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(svgNS, 'svg');
  svg.setAttribute('viewBox', '0 0 32 32');
  svg.setAttribute('width', size);
  svg.setAttribute('height', size);
  svg.setAttribute('aria-hidden', 'true');
  svg.innerHTML = '<rect width="32" height="32" rx="8" fill="#4f46e5"/><circle cx="11" cy="12" r="3.2" fill="#fff"/><circle cx="21" cy="12" r="3.2" fill="#fff"/><circle cx="16" cy="21" r="3.2" fill="#fff"/><path d="M11 12L21 12L16 21Z" fill="none" stroke="#fff" stroke-opacity=".55" stroke-width="1.4"/>';
  return svg;
}

function showShell() {
  const links = VIEWS.map((v) => h('a', { class: 'nav-link', href: v.path, testid: `nav-${v.id}`, dataset: { view: v.id } }, icon(v.id), h('span', null, v.label)));
  const foot = h('div', { class: 'nav-foot' },
    themeButton(),
    h('button', { type: 'button', class: 'ghost sm', onClick: showShortcuts, 'aria-label': 'Keyboard shortcuts' }, icon('keyboard', 14), 'Shortcuts', h('kbd', null, '?')),
    api.auth.info?.auth
      ? h('div', { class: 'row' }, h('span', null, icon('key', 14), api.auth.info.admin ? ' admin key' : ' API key'),
        h('button', { type: 'button', class: 'ghost sm', onClick: signOut }, 'Sign out'))
      : h('div', { class: 'muted' }, 'Local mode · no keys'));
  main = h('main', { class: 'main', id: 'main', tabindex: '-1' });
  put(root, h('div', { class: 'shell' },
    h('nav', { class: 'nav', 'aria-label': 'Main' },
      h('a', { class: 'brand', href: '/ui/sessions', 'aria-label': 'Conclave home' }, logo(), h('span', { class: 'brand-name' }, 'Conclave', h('small', null, 'agent server'))),
      links, h('div', { class: 'spacer' }), foot),
    main));
  render();
}

function signOut() {
  api.setKey(null);
  if (cleanup) { cleanup(); cleanup = null; }
  main = null;
  boot();
}

// ---------- the key form ----------

function showKeyForm(message) {
  if (cleanup) { try { cleanup(); } catch { /* view gone */ } cleanup = null; }
  main = null;
  const input = h('input', { type: 'password', id: 'key', name: 'key', autocomplete: 'current-password', 'aria-label': 'API key', testid: 'key-input', placeholder: 'API key', required: true });
  const error = h('p', { class: 'auth-error', testid: 'auth-error', role: 'alert', hidden: !message }, message || '');
  const submit = h('button', { type: 'submit', class: 'primary', testid: 'key-submit' }, 'Sign in');
  const form = h('form', { class: 'card auth-card', 'aria-labelledby': 'auth-title' },
    h('div', { class: 'brand' }, logo(32), h('span', null, 'Conclave', h('small', null, 'agent server'))),
    h('div', null, h('h1', { id: 'auth-title' }, 'Sign in with an API key'),
      h('p', { class: 'muted', style: { marginTop: '6px' } }, 'This server has API keys. The key stays in this tab only (sessionStorage) and is sent as a bearer header, never in a URL.')),
    h('label', { class: 'field', for: 'key' }, 'API key', input),
    error, submit);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const key = input.value.trim();
    if (!key) return;
    submit.disabled = true;
    error.hidden = true;
    api.setKey(key, { persist: false });
    try {
      api.auth.info = await api.get('/auth/me', { noAuthHook: true });
      api.setKey(key);
      showShell();
    } catch (err) {
      api.setKey(null);
      error.textContent = err.status === 401 ? `${err.message} — a wrong key is refused; check it and try again.` : err.message;
      error.hidden = false;
      submit.disabled = false;
      input.select();
    }
  });
  put(root, h('div', { class: 'auth-wrap' }, form));
  input.focus();
}

// ---------- shortcuts ----------

let dialog = null;
function showShortcuts() {
  if (!dialog) {
    const row = (keys, what) => [h('div', null, keys.map((k) => h('kbd', null, k)).reduce((a, k) => (a.length ? [...a, ' ', k] : [k]), [])), h('div', null, what)];
    dialog = h('dialog', { 'aria-labelledby': 'sc-title' },
      h('h2', { id: 'sc-title' }, 'Keyboard shortcuts'),
      h('div', { class: 'shortcuts' },
        row(['Enter'], 'Send the message'), row(['Shift', 'Enter'], 'New line in the message'),
        row(['Ctrl', 'Enter'], 'Send, queued after the running turn'), row(['Esc'], 'Interrupt the running turn'),
        row(['y'], 'Approve the tool call that waits'), row(['n'], 'Deny it (or Esc)'), row(['a'], 'Approve it and allow its tool for the session'),
        row(['/'], 'Focus the message box'), row(['g', 's'], 'Sessions'), row(['g', 'd'], 'Deliberations'), row(['g', 'p'], 'Pipelines'),
        row(['g', 'w'], 'Gateway'), row(['g', 'x'], 'Sandboxes'), row(['g', 'b'], 'Bus'), row(['?'], 'This help')),
      h('form', { method: 'dialog' }, h('button', { class: 'primary' }, 'Close')));
    document.body.append(dialog);
  }
  if (!dialog.open) dialog.showModal();
}

let gPressed = 0;
document.addEventListener('keydown', (e) => {
  if (!main || e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey) return;
  const t = e.target;
  const typing = t instanceof HTMLElement && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
  if (typing) return;
  if (e.key === '?') { e.preventDefault(); showShortcuts(); return; }
  if (e.key === 'g') { gPressed = Date.now(); return; }
  if (Date.now() - gPressed < 1200) {
    const map = { s: 'sessions', d: 'deliberations', p: 'pipelines', w: 'gateway', x: 'sandboxes', b: 'bus' };
    const v = VIEWS.find((x) => x.id === map[e.key]);
    gPressed = 0;
    if (v) { e.preventDefault(); navigate(v.path); }
  }
});

// Same-origin links to /ui/... stay in the page.
document.addEventListener('click', (e) => {
  if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const a = e.target.closest?.('a[href]');
  if (!a || a.target || a.hasAttribute('download')) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !url.pathname.startsWith('/ui/')) return;
  e.preventDefault();
  navigate(url.pathname + url.search);
});

window.addEventListener('popstate', render);

// ---------- boot ----------

api.auth.onUnauthorized = (err) => {
  api.setKey(null);
  showKeyForm(`${err.message} — sign in again.`);
};

async function boot() {
  try {
    api.auth.info = await api.get('/auth/me', { noAuthHook: true });
    showShell();
  } catch (e) {
    if (e.status === 401) {
      const hadKey = !!api.auth.key;
      api.setKey(null);
      showKeyForm(hadKey ? `${e.message} — a wrong key is refused; enter it again.` : null);
    } else if (e.status === 404) {
      // A server without /auth/me: no keys to ask for.
      api.auth.info = { auth: false, admin: true };
      showShell();
    } else {
      put(root, h('div', { class: 'auth-wrap' }, h('div', { class: 'card auth-card' },
        h('div', { class: 'brand' }, logo(32), 'Conclave'), errorBox(e, () => boot()))));
    }
  }
}

startClock();
if (location.pathname === '/' || location.pathname === '' || location.pathname === '/ui' || location.pathname === '/ui/') history.replaceState(null, '', '/ui/sessions');
boot();

window.addEventListener('unhandledrejection', (e) => {
  if (e.reason?.name === 'AbortError') return;
  if (e.reason instanceof api.ApiError && e.reason.status !== 401) toast(e.reason.message, 'danger');
});
