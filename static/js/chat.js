// One session, live: its event log over the WebSocket (resumed from the last
// seq after a drop, NDJSON follow as the fallback), a composer to send,
// queue and interrupt, and the session's details beside it.

import * as api from './api.js';
import { h, icon, pill, put, errorBox, loading, ago, fmtCost, fmtTokens, fmtInt, fmtDate, fmtBytes, fmtPercent, shortId, toast, confirmButton, copyButton, jsonBlock, fmtMs } from './ui.js';
import { EventLog } from './events.js';
import { ApprovalDock } from './approvals.js';
import { forkAt, snapshotsCard } from './fork.js';
import { changesLine, workspaceCard } from './workspace.js';

/** A session's sandbox as the sandboxes view shows it: its numbers
 * formatted (CPU to one decimal, memory in units), what the backend cannot
 * tell left out. */
function sandboxProps(sb) {
  const known = (v) => v !== null && v !== undefined && v !== '';
  const rows = [
    ['Backend', sb.backend],
    ['State', sb.state],
    ['Image', sb.image],
    ['CPU', known(sb.cpu_percent) ? fmtPercent(sb.cpu_percent) : null],
    ['Memory', known(sb.memory_bytes) ? fmtBytes(sb.memory_bytes) : null],
    ['PIDs', known(sb.pids) ? String(sb.pids) : null],
  ];
  return rows.filter(([, v]) => known(v))
    .flatMap(([k, v]) => [h('dt', null, k), h('dd', { class: 'small', testid: `sandbox-${k.toLowerCase()}` }, String(v))]);
}

/** A link to the richer view of a pipeline run or a submitted deliberation. */
function relatedLink(status, id) {
  if (status.kind === 'pipeline') {
    let thread = null;
    try { thread = JSON.parse(localStorage.getItem('conclave.threads') || '{}')[id]; } catch { /* none */ }
    return thread ? h('a', { href: `/ui/pipelines/${encodeURIComponent(thread)}` }, 'Run graph →') : null;
  }
  if (status.kind === 'deliberation' && status.ephemeral) return h('a', { href: `/ui/deliberations/${id}` }, 'Proposals side by side →');
  return null;
}

export function mountChat(main, id, ctx) {
  let alive = true;
  let sock = null;
  let log = null;
  let status = null;
  let running = false;
  const pending = [];
  const cleanups = [];
  put(main, loading('Opening the session…'));

  api.get(`/agent/session/${id}/status`).then((st) => {
    if (!alive) return;
    status = st;
    build();
  }).catch((e) => {
    if (!alive) return;
    put(main, h('div', { class: 'stack' },
      h('a', { href: '/ui/sessions', class: 'crumb' }, icon('back', 14), 'Sessions'),
      e.status === 404
        ? errorBox(new Error(`Session ${id} was not found. It may have been deleted, be an ephemeral run past its retention, or belong to another key.`))
        : errorBox(e, () => ctx.navigate(location.pathname, { replace: true }))));
  });

  function build() {
    const kind = status.kind || 'agent';
    const threadLink = h('span', null, relatedLink(status, id));
    const related = () => threadLink;
    const title = h('h1', { class: 'ellipsis' }, status.session_name || `Session ${shortId(id)}`);
    const statePill = h('span');
    const conn = h('span', { class: 'pill', testid: 'connection', role: 'status', dataset: { state: 'connecting' } }, 'Connecting…');
    const banner = h('div', { class: 'banner warn conn-banner', role: 'alert', hidden: true });
    const scroller = h('div', { class: 'log-scroller', testid: 'event-list', role: 'log', 'aria-label': 'Session events', tabindex: '0' });
    const jump = h('button', { type: 'button', class: 'jump sm', hidden: true, onClick: () => log.scrollToBottom() }, 'Jump to latest ↓');
    const placeholders = {
      agent: 'Message the agent… (Enter to send, Shift+Enter for a new line)',
      deliberation: 'A task for the agents to deliberate on…',
      pipeline: 'A request for the pipeline…',
    };
    const prompt = h('textarea', { testid: 'prompt', rows: 2, 'aria-label': 'Message', placeholder: placeholders[kind] || 'A message for this session…' });
    const queue = h('input', { type: 'checkbox', testid: 'queue', id: 'queue-box', 'aria-label': 'Queue after the running turn' });
    const send = h('button', { type: 'submit', class: 'primary', testid: 'send', 'aria-label': 'Send (Enter)' }, icon('send', 16), 'Send');
    const interrupt = h('button', { type: 'button', class: 'danger', testid: 'interrupt', 'aria-label': 'Interrupt the running turn (Esc)', disabled: true }, icon('stop', 16), 'Interrupt');
    const pendingBox = h('div', { class: 'pending', 'aria-live': 'polite' });
    const side = h('aside', { class: 'chat-side', 'aria-label': 'Session details' });
    // Decisions go out on the socket once it is there (POST otherwise).
    const dock = new ApprovalDock(id, { send: (frame) => sock?.send(frame) ?? false, prompt });
    const composer = h('form', { class: 'composer', 'aria-label': 'Send a message' },
      dock.el, pendingBox,
      h('div', { class: 'composer-box' }, prompt,
        h('div', { class: 'composer-bar' },
          h('label', { class: 'check', for: 'queue-box' }, queue, 'Queue if busy'),
          h('span', { class: 'hint hide-sm' }, h('kbd', null, 'Enter'), ' send · ', h('kbd', null, 'Esc'), ' interrupt · ', h('kbd', null, 'Ctrl'), h('kbd', null, 'Enter'), ' queue'),
          interrupt, send)));
    put(main, h('section', { class: 'chat' },
      h('header', { class: 'chat-head' },
        h('a', { href: '/ui/sessions', class: 'btn ghost sm', 'aria-label': 'Back to sessions' }, icon('back', 14)),
        h('div', { class: 'grow', style: { minWidth: '0' } }, title, h('div', { class: 'row small muted' }, h('span', { class: 'tag' }, kind), h('span', { class: 'id hide-sm' }, id), copyButton(id, 'Copy session id'), related())),
        statePill, conn),
      h('div', { class: 'chat-log' }, banner, scroller, jump),
      composer, side));

    // A fork's history starts with its source's messages, whose prompts
    // have no turn in its log: its `forked` event says how many messages
    // it carries. (An older server's event lacks the count: then they are
    // told apart once the page has every event and no turn runs, each turn
    // of its own having added one prompt.)
    let forked = false;
    let carried = null;
    let inherited = null;
    log = new EventLog(scroller, {
      kind,
      onStick: (stuck) => { jump.hidden = stuck; },
      onApproval: (ev) => dock.seen(ev),
      onFork: kind === 'agent' ? (seq, button) => forkAt(id, status.session_name, seq, button, ctx.navigate) : undefined,
      resultExtra: kind === 'agent' ? (ev) => changesLine(id, ev) : undefined,
      onForked: (ev) => { forked = true; carried = Number.isInteger(ev.history_len) ? ev.history_len : null; setPrompts(); },
      onTurn: (inTurn, index) => {
        running = inTurn;
        if (inTurn) dock.clear();
        // The oldest message this page sent is the one that just started;
        // the status refresh below corrects it if another client sent one.
        if (inTurn && pending.length) {
          const sent = pending.shift();
          const turn = log.turns[index];
          if (turn && (turn.prompt === undefined || turn.prompt === null)) turn.setPrompt(sent);
        }
        // Once a frame at most: a replay goes through thousands of turns.
        if (!uiFrame) {
          uiFrame = requestAnimationFrame(() => {
            uiFrame = 0;
            drawPending();
            showState();
          });
        }
        scheduleStatus();
      },
    });
    setPrompts();

    let uiFrame = 0;
    cleanups.push(() => cancelAnimationFrame(uiFrame));

    // ---- live events ----
    let queued = [];
    let raf = 0;
    const flush = () => {
      raf = 0;
      const batch = queued.splice(0, 4000);
      for (const ev of batch) log.add(ev);
      if (queued.length) raf = requestAnimationFrame(flush);
    };
    const onMessage = (m) => {
      if (m.thread_id && kind === 'pipeline' && !threadLink.childElementCount) {
        try {
          const t = JSON.parse(localStorage.getItem('conclave.threads') || '{}');
          t[id] = m.thread_id;
          localStorage.setItem('conclave.threads', JSON.stringify(t));
        } catch { /* storage off */ }
        put(threadLink, relatedLink(status, id));
      }
      if (typeof m.seq === 'number') {
        queued.push(m);
        if (!raf) raf = requestAnimationFrame(flush);
        return;
      }
      if (dock.reply(m)) return;
      if (m.type === 'interrupted') {
        toast(m.interrupted ? 'Interrupted' : 'Nothing was running');
      } else if (m.type === 'error') {
        toast(m.message || m.code, 'danger');
        if (m.code === 'session_busy' && pending.length) {
          const back = pending.pop();
          if (!prompt.value) prompt.value = back;
          drawPending();
        }
      }
    };
    let countdown = null;
    const onState = (state, d) => {
      clearInterval(countdown);
      banner.hidden = true;
      conn.className = 'pill';
      if (state === 'open') {
        conn.dataset.state = 'connected';
        conn.classList.add('ok');
        conn.textContent = d.mode === 'http' ? 'Connected (HTTP stream)' : 'Connected';
      } else if (state === 'connecting') {
        conn.dataset.state = 'connecting';
        conn.classList.add('info', 'live');
        conn.textContent = 'Connecting…';
      } else if (state === 'reconnecting') {
        conn.dataset.state = 'reconnecting';
        conn.classList.add('warn', 'live');
        const tick = () => {
          const left = Math.max(0, Math.ceil((d.at - Date.now()) / 1000));
          conn.textContent = `Reconnecting in ${left}s`;
          put(banner, icon('alert', 16), h('span', { class: 'grow' }, `Connection lost (${d.reason}). Reconnecting in ${left}s — attempt ${d.attempt}. Nothing is missed: the log resumes after event ${log.lastSeq}.`),
            h('button', { type: 'button', class: 'sm', onClick: () => sock.retryNow() }, 'Retry now'));
        };
        tick();
        banner.hidden = false;
        countdown = setInterval(tick, 500);
      } else if (state === 'gone') {
        conn.dataset.state = 'gone';
        conn.classList.add('danger');
        conn.textContent = 'Session gone';
        put(banner, icon('alert', 16), `This session is no longer available: ${d.error?.message || 'not found'}.`);
        banner.hidden = false;
      } else if (state === 'closed') {
        conn.dataset.state = 'closed';
        conn.textContent = 'Closed';
      }
    };
    sock = new api.LiveSocket({
      path: '/agent/ws',
      params: () => ({ session_id: id, since: log.lastSeq }),
      fallback: () => `/agent/session/${id}/events${api.qs({ since: log.lastSeq, follow: true })}`,
      check: () => api.get(`/agent/session/${id}/status`),
      onMessage,
      onState,
    }).start();
    cleanups.push(() => { sock.stop(); clearInterval(countdown); cancelAnimationFrame(raf); log.destroy(); dock.destroy(); });

    // ---- composer ----
    const autosize = () => { prompt.style.height = 'auto'; prompt.style.height = `${Math.min(240, prompt.scrollHeight + 2)}px`; };
    prompt.addEventListener('input', autosize);
    const doSend = async (forceQueue) => {
      const text = prompt.value;
      if (!text.trim()) { prompt.focus(); return; }
      const q = forceQueue || queue.checked;
      if (running && !q) {
        toast('A turn is running: tick “Queue if busy” (or press Ctrl+Enter) to send it after, or press Esc to interrupt.', 'danger');
        return;
      }
      prompt.value = '';
      autosize();
      pending.push(text);
      drawPending();
      log.scrollToBottom();
      if (sock.send({ type: 'message', prompt: text, queue: q })) return;
      try {
        const res = await api.post(`/agent/session/${id}/message`, { prompt: text, queue: q }, { raw: true, headers: { Accept: 'application/x-ndjson' } });
        res.body?.cancel().catch(() => {});
      } catch (e) {
        const i = pending.lastIndexOf(text);
        if (i >= 0) pending.splice(i, 1);
        drawPending();
        if (!prompt.value) prompt.value = text;
        toast(e.message, 'danger');
      }
    };
    const doInterrupt = async () => {
      if (sock.send({ type: 'interrupt' })) return;
      try {
        const r = await api.post(`/agent/session/${id}/interrupt`, {});
        toast(r.interrupted ? 'Interrupted' : 'Nothing was running');
      } catch (e) { toast(e.message, 'danger'); }
    };
    composer.addEventListener('submit', (e) => { e.preventDefault(); doSend(false); });
    interrupt.addEventListener('click', doInterrupt);
    prompt.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        doSend(e.ctrlKey || e.metaKey);
      }
    });
    const onKey = (e) => {
      // A waiting call takes y, n, a, Enter and Esc first.
      if (dock.key(e)) return;
      if (e.key === 'Escape' && running && !document.querySelector('dialog[open]')) {
        e.preventDefault();
        doInterrupt();
      } else if (e.key === '/' && document.activeElement !== prompt && !/^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement?.tagName || '')) {
        e.preventDefault();
        prompt.focus();
      }
    };
    document.addEventListener('keydown', onKey);
    cleanups.push(() => document.removeEventListener('keydown', onKey));

    function drawPending() {
      put(pendingBox, pending.map((p, i) => h('span', { class: 'tag', title: p }, i === 0 && !running ? 'Sending: ' : 'Queued: ', p.slice(0, 80))));
    }

    let shownRunning = null;
    function showState() {
      const st = running ? 'running' : (status.status === 'running' ? 'idle' : status.status);
      put(statePill, pill(st));
      interrupt.disabled = !running;
      if (shownRunning !== running) { shownRunning = running; drawSide(); }
    }

    function setPrompts() {
      const prompts = (status.history || []).filter((m) => m.role === 'user').map((m) => m.content);
      if (!forked || kind !== 'agent') { log.setPrompts(prompts); return; }
      if (inherited === null && carried !== null) {
        inherited = (status.history || []).slice(0, carried).filter((m) => m.role === 'user').length;
        log.setInherited(prompts.slice(0, inherited));
      } else if (inherited === null && !status.running && !running && log.lastSeq >= (status.last_seq || 0)) {
        inherited = Math.max(0, prompts.length - log.liveTurns().length);
        log.setInherited(prompts.slice(0, inherited));
      }
      log.setPrompts(inherited === null ? [] : prompts.slice(inherited));
    }

    let statusTimer = null;
    function scheduleStatus() {
      clearTimeout(statusTimer);
      statusTimer = setTimeout(async () => {
        try {
          status = await api.get(`/agent/session/${id}/status`);
          if (!alive) return;
          setPrompts();
          drawSide();
          shownRunning = running;
          showState();
        } catch { /* the socket shows what is wrong */ }
      }, 250);
    }
    cleanups.push(() => clearTimeout(statusTimer));

    // The kept snapshots, read again whenever the status is (a turn end
    // adds one); a server without sandboxes has none to show.
    let snapshots = null;
    let snapshotsAsked = -1;
    // Made once: what it says of an upload stays across redraws.
    const workspace = kind === 'agent' ? workspaceCard(id) : null;
    function readSnapshots() {
      if (kind !== 'agent' || snapshotsAsked === status.last_seq) return;
      snapshotsAsked = status.last_seq;
      snapshotsCard(id).then((card) => {
        if (!alive || snapshots === card) return;
        snapshots = card;
        drawSide();
      });
    }

    function drawSide() {
      readSnapshots();
      const u = status.usage || {};
      const sb = status.sandbox;
      const calls = status.gateway_calls || [];
      const opts = status.options || {};
      put(side,
        h('div', { class: 'card side-card' }, h('h2', null, 'Session'),
          h('dl', { class: 'props' },
            h('dt', null, 'Status'), h('dd', null, pill(running ? 'running' : (status.status === 'running' ? 'idle' : status.status))),
            h('dt', null, 'Kind'), h('dd', null, status.kind),
            status.model || opts.model ? [h('dt', null, 'Model'), h('dd', { class: 'mono' }, status.model || opts.model)] : null,
            status.pipeline ? [h('dt', null, 'Pipeline'), h('dd', null, status.pipeline)] : null,
            opts.permissions?.mode ? [h('dt', null, 'Permissions'), h('dd', { class: 'mono', testid: 'permission-mode-shown' }, opts.permissions.mode)] : null,
            h('dt', null, 'Created'), h('dd', null, fmtDate(status.created_at)),
            h('dt', null, 'Updated'), h('dd', null, ago(status.updated_at)),
            h('dt', null, 'Events'), h('dd', null, fmtInt(Math.max(status.last_seq || 0, log.lastSeq))),
            status.ephemeral ? [h('dt', null, 'Ephemeral'), h('dd', null, 'yes')] : null)),
        h('div', { class: 'card side-card' }, h('h2', null, 'Usage'),
          h('dl', { class: 'props' },
            h('dt', null, 'Cost'), h('dd', null, fmtCost(u.cost_usd)),
            h('dt', null, 'Input'), h('dd', null, `${fmtTokens(u.input_tokens)} tokens`),
            h('dt', null, 'Output'), h('dd', null, `${fmtTokens(u.output_tokens)} tokens`),
            h('dt', null, 'Model calls'), h('dd', null, fmtInt(u.turns)),
            h('dt', null, 'Tool calls'), h('dd', null, fmtInt(u.tool_calls)))),
        kind !== 'agent' && !sb ? null : h('div', { class: 'card side-card', testid: 'sandbox-card' }, h('h2', null, 'Sandbox'),
          sb ? h('dl', { class: 'props' },
            h('dt', null, 'ID'), h('dd', { class: 'mono small', title: sb.id }, shortId(sb.id || sb.sandbox_id, 12)),
            ...sandboxProps(sb),
            h('dt', null, ''), h('dd', null, h('a', { href: '/ui/sandboxes' }, 'All sandboxes →')))
            : h('p', { class: 'muted small', style: { marginTop: '8px' } }, 'None yet: one is made at the first tool call.')),
        calls.length ? h('div', { class: 'card side-card' }, h('h2', null, 'Gateway calls'),
          h('ul', { class: 'small', style: { paddingLeft: '18px', margin: '8px 0 0' } }, calls.slice(0, 8).map((c) => h('li', null, `${c.replica || '—'} · ${c.status} · ${fmtMs(c.latency_ms)}`))),
          h('a', { class: 'small', href: `/ui/gateway?session_id=${id}` }, 'Traces of this session →')) : null,
        workspace,
        snapshots,
        Object.keys(opts).length ? h('div', { class: 'card side-card' }, h('h2', null, 'Options'), h('div', { style: { marginTop: '8px' } }, jsonBlock(opts, { lines: 10 }))) : null,
        h('div', { class: 'side-card' }, confirmButton('Delete session', async () => {
          try {
            await api.del(`/agent/session/${id}`, {});
            toast('Session deleted', 'ok');
            ctx.navigate('/ui/sessions');
          } catch (e) { toast(e.message, 'danger'); }
        }, { class: '', 'aria-label': 'Delete this session' })));
    }

    running = !!status.running;
    showState();
    drawSide();
    if (kind === 'agent') prompt.focus();
  }

  return () => {
    alive = false;
    for (const c of cleanups) c();
  };
}
