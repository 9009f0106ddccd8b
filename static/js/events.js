// A session's event log as blocks in a virtualised list: a turn's prompt,
// streamed text, tool calls with their input and output, errors, the
// result; deliberation rounds and pipeline steps for those kinds. Every log
// event is one element with data-seq and data-type; an event with a seq at
// or below the last one shown is dropped, so a reconnect or a replay never
// shows one twice.

import { h, icon, pill, fmtMs, fmtCost, fmtTokens, fmtBytes, fmtTime, codeBlock, jsonBlock, richText } from './ui.js';
import { VirtualList } from './vlist.js';
import { forkButton, forkedLine, inheritedPrompts } from './fork.js';

function evEl(tag, ev, props = {}, ...children) {
  return h(tag, { ...props, testid: 'event', dataset: { seq: ev.seq, type: ev.type, ...(props.dataset || {}) }, title: props.title || fmtTime(ev.ts) }, ...children);
}

function agentChip(ev) {
  return ev.agent_id ? h('span', { class: 'tag', title: 'agent' }, ev.agent_id) : null;
}

export function toolName(tool) {
  return String(tool || '').replace(/^mcp__sandbox__/, '').replace(/^mcp__/, '');
}

class Block {
  constructor(log, type, estimate = 48) {
    this.log = log;
    this.type = type;
    this.events = [];
    this.el = null;
    this.index = -1;
    this.estimate = estimate;
  }

  build() {
    this.el = h('div', { class: `blk blk-${this.type}` });
    this.render(this.el);
    for (const ev of this.events) this.apply(ev);
    return this.el;
  }

  push(ev) {
    this.events.push(ev);
    if (this.el) this.apply(ev);
    else this.log.vl.estimate(this.index, this.guess());
  }

  guess() {
    return this.estimate;
  }

  render() {}
  apply() {}
}

class TurnBlock extends Block {
  constructor(log, n) {
    super(log, 'turn', 64);
    this.n = n;
    this.prompt = undefined;
  }

  render(el) {
    this.label = h('div', { class: 'turn-label' }, this.log.kind === 'agent' ? 'You' : `Turn ${this.n + 1}`);
    this.bubble = h('div', { class: 'bubble-user' });
    el.append(this.label, this.bubble);
    this.show();
  }

  /** A rewind took this turn back: its prompt left the history. */
  undo() {
    this.undone = true;
    this.prompt = undefined;
    if (this.el) this.show();
  }

  setPrompt(text) {
    if (text === this.prompt) return;
    this.prompt = text;
    if (this.el) this.show();
  }

  show() {
    this.el.classList.toggle('undone', !!this.undone);
    if (this.undone) {
      this.label.textContent = 'Undone by a rewind';
      this.bubble.hidden = true;
    } else if (this.prompt === undefined || this.prompt === null) {
      this.bubble.hidden = this.log.kind !== 'agent';
      this.bubble.textContent = '…';
      this.bubble.classList.add('muted');
    } else if (this.prompt === '') {
      this.bubble.hidden = true;
    } else {
      this.bubble.hidden = false;
      this.bubble.classList.remove('muted');
      const text = this.prompt;
      const lines = text.split('\n');
      const long = text.length > 600 || lines.length > 10;
      if (!long) {
        this.bubble.textContent = text;
        return;
      }
      const short = lines.slice(0, 10).join('\n').slice(0, 600);
      const body = h('span', null, `${short}…`);
      const toggle = h('button', { type: 'button', class: 'sm ghost fold-toggle', 'aria-expanded': 'false' }, 'Show all');
      toggle.addEventListener('click', () => {
        const open = toggle.getAttribute('aria-expanded') !== 'true';
        body.textContent = open ? text : `${short}…`;
        toggle.setAttribute('aria-expanded', String(open));
        toggle.textContent = open ? 'Show less' : 'Show all';
      });
      this.bubble.replaceChildren(body, h('div', null, toggle));
    }
  }

  guess() {
    return 64 + Math.min(400, ((this.prompt || '').length / 80) * 21);
  }
}

class StatusBlock extends Block {
  constructor(log) { super(log, 'status', 30); }
  apply(ev) {
    this.el.append(evEl('div', ev, { class: 'ev-status' }, agentChip(ev), ev.message));
  }
  guess() { return 10 + this.events.length * 20; }
}

/** What the model's harness did on its own: said apart from the model's text. */
class InterventionBlock extends Block {
  constructor(log) { super(log, 'intervention', 30); }
  apply(ev) {
    this.el.append(evEl('div', ev, { class: 'ev-intervention', title: 'Done by the harness, not the model' },
      agentChip(ev), h('strong', null, `Harness · ${String(ev.kind || '').replaceAll('_', ' ')}`), h('span', null, ev.detail || '')));
  }
  guess() { return 10 + this.events.length * 22; }
}

class TextBlock extends Block {
  constructor(log, agent, reasoning) {
    super(log, 'text', 60);
    this.agent = agent;
    // The model's reasoning before its answer: shown apart, muted.
    this.reasoning = reasoning;
    this.chars = 0;
    this.final = false;
  }

  render(el) {
    this.deltas = h('div', { class: 'assistant-text deltas streaming' });
    if (this.reasoning) el.classList.add('reasoning');
    const who = this.reasoning ? 'Reasoning' : this.log.kind === 'agent' && !this.agent ? 'Assistant' : 'Agent';
    el.append(h('div', { class: 'who' }, who, this.agent ? h('span', { class: 'tag' }, this.agent) : null), this.deltas);
  }

  push(ev) {
    this.chars += (ev.content || '').length;
    super.push(ev);
  }

  apply(ev) {
    if (ev.type === 'text_delta') {
      this.deltas.append(evEl('span', ev, {}, ev.content));
      return;
    }
    // The whole text: shown formatted; the deltas it repeats stay in the
    // DOM (hidden) so each event keeps its element.
    this.final = true;
    const hasDeltas = this.deltas.childElementCount > 0;
    this.deltas.classList.remove('streaming');
    this.deltas.hidden = hasDeltas;
    this.el.append(evEl('div', ev, { class: 'assistant-text' }, richText(ev.content)));
  }

  close() {
    this.final = true;
    this.deltas?.classList.remove('streaming');
  }

  guess() { return 40 + Math.ceil(this.chars / 90) * 22; }
}

class ToolBlock extends Block {
  constructor(log, id) {
    super(log, 'tool', 150);
    this.id = id;
  }

  render(el) {
    this.name = h('span', { class: 'name' });
    this.state = pill('running', 'info live');
    this.agent = h('span');
    this.meta = h('span', { class: 'muted small' });
    this.body = h('div', { class: 'tool-body' });
    this.live = null;
    el.append(h('div', { class: 'tool', testid: 'tool', dataset: { toolId: this.id } },
      h('div', { class: 'tool-head' }, icon('tool', 15), this.name, this.agent, h('span', { class: 'grow' }), this.meta, this.state),
      this.body));
  }

  apply(ev) {
    if (ev.agent_id && !this.agent.childElementCount) this.agent.append(agentChip(ev));
    if (ev.type === 'tool_use') {
      this.named(ev.tool, true);
      this.body.prepend(evEl('div', ev, { class: 'tool-input' }, h('div', { class: 'label' }, 'Input'), toolInput(ev.tool, ev.input)));
    } else if (ev.type === 'tool_output') {
      if (!this.live) {
        this.livePre = h('pre', { class: 'code wrap' });
        this.live = h('div', { class: 'tool-live' }, h('div', { class: 'label' }, 'Output (live)'), this.livePre);
        this.body.append(this.live);
      }
      this.livePre.append(evEl('span', ev, { class: ev.stream === 'stderr' ? 'stream-err' : '' }, ev.content));
    } else if (ev.type === 'tool_result') {
      this.named(ev.tool);
      if (this.live) this.live.hidden = true;
      const out = ev.output;
      const failed = ev.is_error || (out && typeof out === 'object' && ((out.exit_code ?? 0) !== 0 || out.status === 'error'));
      this.setState(h('span', { class: `pill ${failed ? 'danger' : 'ok'}` }, failed ? (out?.exit_code !== undefined ? `exit ${out.exit_code}` : 'error') : 'ok'));
      if (out && typeof out === 'object' && out.duration_ms !== undefined) this.meta.textContent = fmtMs(out.duration_ms);
      this.body.append(evEl('div', ev, { class: 'tool-output' }, toolOutput(out)));
    } else if (ev.type === 'approval_requested') {
      this.named(ev.tool);
      this.setState(pill('waiting for approval', 'warn live'));
      this.body.append(evEl('div', ev, { class: 'tool-approval small' }, h('span', { class: 'label' }, 'Approval'), ev.reason || 'it needs a decision'));
    } else if (ev.type === 'approval_decided') {
      const allowed = ev.decision === 'allow';
      if (allowed) this.setState(pill('running', 'info live'));
      this.body.append(evEl('div', ev, { class: 'tool-approval small' }, pill(allowed ? 'approved' : 'denied', allowed ? 'ok' : 'danger'),
        `by ${ev.by}`, ev.message ? ` · ${ev.message}` : '', ev.remembered ? ` · ${ev.remembered} allowed for the session` : ''));
    }
  }

  /** Names the call, unless it has its name (`again`: from its tool_use). */
  named(tool, again = false) {
    if (this.name.textContent && !again) return;
    this.name.textContent = toolName(tool);
    this.name.title = tool;
  }

  setState(st) {
    this.state.replaceWith(st);
    this.state = st;
  }

  close() {
    if (this.state?.textContent === 'running' || this.state?.textContent === 'waiting for approval') this.setState(pill('no result', 'warn'));
  }

  guess() {
    let n = 90;
    for (const ev of this.events) {
      const text = ev.type === 'tool_use' ? JSON.stringify(ev.input || '') : ev.type === 'tool_result' ? JSON.stringify(ev.output || '') : '';
      n += Math.min(22 * 20, (text.split('\\n').length + 1) * 19) + 24;
    }
    return n;
  }
}

function toolInput(tool, input) {
  const t = toolName(tool);
  if (input && typeof input === 'object') {
    if (typeof input.code === 'string') return codeBlock(input.code, input.language || 'python');
    if (typeof input.command === 'string') return codeBlock(`$ ${input.command}`, 'bash');
    if (t === 'Write' && typeof input.content === 'string') {
      return h('div', null, h('div', { class: 'mono small muted' }, input.file_path || input.path || ''), codeBlock(input.content, langOfPath(input.file_path || input.path)));
    }
  }
  return jsonBlock(input);
}

function langOfPath(path) {
  const ext = String(path || '').split('.').pop();
  return { py: 'python', sh: 'bash', json: 'json', js: 'js', ts: 'js' }[ext];
}

export function toolOutput(out) {
  if (typeof out === 'string') return codeBlock(out, undefined, { lines: 20 });
  if (out && typeof out === 'object' && ('stdout' in out || 'stderr' in out)) {
    const parts = [];
    if (out.stdout) parts.push(h('div', { class: 'label' }, 'stdout'), codeBlock(out.stdout.replace(/\n$/, ''), undefined, { lines: 20 }));
    if (out.stderr) parts.push(h('div', { class: 'label stream-err' }, 'stderr'), codeBlock(out.stderr.replace(/\n$/, ''), undefined, { lines: 12 }));
    if (!out.stdout && !out.stderr) parts.push(h('div', { class: 'muted small' }, '(no output)'));
    const extra = [];
    if (out.exit_code !== undefined && out.exit_code !== null) extra.push(`exit ${out.exit_code}`);
    if (out.truncated) extra.push('output truncated');
    if (extra.length) parts.push(h('div', { class: 'muted small' }, extra.join(' · ')));
    return h('div', { class: 'stack', style: { gap: '4px' } }, parts);
  }
  if (out && typeof out === 'object' && typeof out.content === 'string') return codeBlock(out.content, undefined, { lines: 20 });
  return jsonBlock(out);
}

class ErrorBlock extends Block {
  constructor(log) { super(log, 'error', 56); }
  apply(ev) {
    this.el.append(evEl('div', ev, { class: 'ev-error', role: 'note' }, agentChip(ev), h('strong', null, ev.code ? `${ev.code}: ` : 'Error: '), ev.message));
  }
}

class ResultBlock extends Block {
  constructor(log) { super(log, 'result', 48); }
  render(el) {
    el.setAttribute('data-testid', 'result');
  }
  apply(ev) {
    this.el.dataset.status = ev.status;
    const u = ev.usage || {};
    const kv = (k, v) => h('span', { class: 'kv' }, h('span', null, k), h('span', null, v));
    this.el.append(evEl('div', ev, { class: 'result', dataset: { status: ev.status } },
      pill(ev.status),
      kv('cost', fmtCost(ev.cost_usd, ev.cost_known)),
      kv('tokens', `${fmtTokens(u.input_tokens)} in · ${fmtTokens(u.output_tokens)} out`),
      kv('model calls', String(ev.turns ?? u.turns ?? 0)),
      u.tool_calls ? kv('tools', String(u.tool_calls)) : null,
      kv('time', fmtMs(ev.duration_ms)),
      this.log.resultExtra ? this.log.resultExtra(ev) : null,
      this.log.kind !== 'agent' && ev.result ? h('span', { class: 'muted ellipsis', style: { maxWidth: '100%' } }, ev.result) : null,
      this.log.onFork && this.log.kind === 'agent' ? forkButton(ev.seq, this.log.onFork) : null));
  }
}

/** A fork's first event: where it came from, and the prompts it carries. */
class ForkedBlock extends Block {
  constructor(log) { super(log, 'forked', 40); }
  render(el) {
    this.inherited = h('div');
    el.append(this.inherited);
    this.showInherited();
  }
  apply(ev) {
    this.inherited.before(evEl('div', ev, { class: 'mini forked' }, forkedLine(ev)));
  }
  setInherited(prompts) {
    this.prompts = prompts;
    if (this.el) this.showInherited();
  }
  showInherited() {
    this.inherited.replaceChildren(...[inheritedPrompts(this.prompts || [])].filter(Boolean));
  }
}

class GenericBlock extends Block {
  constructor(log, type) { super(log, type, 40); }
  apply(ev) {
    this.el.append(evEl('div', ev, { class: 'mini' }, agentChip(ev), h('span', { class: 'tag' }, ev.type), h('span', { class: 'json-line' }, summary(ev))));
  }
}

function summary(ev) {
  const { type, session_id, seq, ts, agent_id, ...rest } = ev;
  return JSON.stringify(rest);
}

class RoundBlock extends Block {
  constructor(log, round) {
    super(log, 'round', 120);
    this.round = round;
    this.cards = new Map();
  }

  render(el) {
    this.grid = h('div', { class: 'proposals' });
    el.append(h('div', { class: 'round-divider' }, this.round === 0 ? 'Round 0 · proposals' : `Round ${this.round} · critique`), this.grid);
  }

  apply(ev) {
    if (ev.type === 'round_started') {
      this.grid.before(evEl('span', ev, { class: 'sr-only' }, `round ${ev.round} started`));
      return;
    }
    let card = this.cards.get(ev.agent_id);
    if (!card) {
      card = { state: pill('working', 'info live'), body: h('div', { class: 'card-body' }), meta: h('span', { class: 'muted small' }) };
      card.el = h('div', { class: 'card proposal' }, h('div', { class: 'card-head' }, h('strong', { class: 'mono small' }, ev.agent_id || 'agent'), h('span', { class: 'grow' }), card.meta, card.state), card.body);
      this.cards.set(ev.agent_id, card);
      this.grid.append(card.el);
    }
    if (ev.type === 'agent_started') {
      card.meta.textContent = ev.model || '';
      card.body.append(evEl('span', ev, { class: 'sr-only' }, 'started'));
    } else if (ev.type === 'agent_completed') {
      const st = pill('done', 'ok');
      card.state.replaceWith(st);
      card.state = st;
      card.meta.textContent = `${card.meta.textContent ? `${card.meta.textContent} · ` : ''}${fmtMs(ev.duration_ms)}`;
      card.body.append(evEl('div', ev, {}, trimmed(ev.proposal?.content)));
    } else if (ev.type === 'agent_failed') {
      const st = pill('failed', 'danger');
      card.state.replaceWith(st);
      card.state = st;
      card.el.classList.add('failed');
      card.body.append(evEl('div', ev, { class: 'stream-err' }, ev.error));
    }
  }

  guess() { return 140 + Math.min(300, this.events.length * 20); }
}

function trimmed(text, max = 1200) {
  const t = String(text ?? '');
  return t.length > max ? `${t.slice(0, max)}…` : t;
}

class DecisionBlock extends Block {
  constructor(log) { super(log, 'decision', 120); }
  apply(ev) {
    if (ev.type === 'decision') {
      this.el.append(evEl('div', ev, { class: 'card decision' },
        h('div', { class: 'card-head' }, h('strong', null, 'Decision'), pill(ev.method, 'accent'), h('span', null, 'chose ', h('strong', { class: 'mono' }, ev.choice))),
        h('div', { class: 'card-body stack' }, h('p', null, ev.reasoning), codeBlock(ev.content, 'text', { lines: 8, wrap: true }))));
    } else {
      this.el.append(evEl('div', ev, { class: 'mini' }, pill(ev.status), `${ev.successful_responses}/${ev.total_agents} agents answered`, ev.reason ? `· ${ev.reason}` : '', `· ${fmtMs(ev.duration_ms)}`));
    }
  }
}

class NodeBlock extends Block {
  constructor(log, step) {
    super(log, 'node', 60);
    this.step = step;
  }
  render(el) {
    this.head = h('div', { class: 'mini' });
    this.rows = h('div', { class: 'stack', style: { gap: '2px', paddingLeft: '22px' } });
    el.append(this.head, this.rows);
  }
  apply(ev) {
    if (ev.type === 'node_started') {
      this.state = pill('running', 'info live');
      this.head.append(evEl('span', ev, { class: 'row' }, h('span', { class: 'step-no' }, `#${ev.step}`), h('strong', null, ev.node)), this.state);
    } else if (ev.type === 'node_completed') {
      const st = pill(ev.decision, 'ok');
      this.state?.replaceWith(st);
      this.state = st;
      this.head.append(evEl('span', ev, { class: 'muted small' }, fmtMs(ev.duration_ms)));
    } else if (ev.type === 'node_failed') {
      this.rows.append(evEl('div', ev, { class: 'stream-err small' }, `attempt ${ev.attempt}: ${ev.error}`));
    } else if (ev.type === 'route') {
      this.rows.append(evEl('div', ev, { class: 'small muted' }, `→ ${ev.to}`, ev.reason ? ` (${ev.reason})` : ''));
    } else if (ev.type === 'checkpoint') {
      this.rows.append(evEl('div', ev, { class: 'small muted' }, `checkpoint ${ev.step} saved`));
    }
  }
  guess() { return 30 + this.events.length * 18; }
}

/** One-line events of deliberations and pipelines. */
class NoteBlock extends Block {
  constructor(log, type) { super(log, type, 36); }
  apply(ev) {
    if (ev.type === 'deliberation_started') {
      this.el.append(evEl('div', ev, { class: 'mini' }, h('strong', null, 'Deliberation'), `${ev.num_agents} × ${ev.role}`,
        h('span', { class: 'muted' }, `· ${ev.rounds} critique round${ev.rounds === 1 ? '' : 's'} · aggregate ${ev.aggregate}`)));
    } else if (ev.type === 'rewound') {
      const files = ev.workspace === 'restored' ? 'its files went back too' : 'its files stayed as they were';
      this.el.append(evEl('div', ev, { class: 'mini' }, h('strong', null, 'Rewound'),
        `to the turn end at seq ${ev.to_seq}: the turns after it are undone, ${files}`,
        h('span', { class: 'muted' }, `· history ${ev.history_len} message${ev.history_len === 1 ? '' : 's'}`)));
    } else if (ev.type === 'workspace_uploaded') {
      this.el.append(evEl('div', ev, { class: 'mini', testid: 'uploaded' }, h('strong', null, ev.source ? 'Cloned' : 'Uploaded'),
        `${ev.files} file${ev.files === 1 ? '' : 's'} · ${fmtBytes(ev.bytes)} into ${ev.path}`,
        ev.source ? h('span', { class: 'muted mono' }, `from ${ev.source}`) : null));
    } else if (ev.type === 'compacted') {
      // A fold: what the model is sent from here on is shorter; the
      // stored history (and this log) keeps every message.
      const why = { auto: 'near the context window', context_error: 'after the model refused a long request', request: 'on request' }[ev.reason] || ev.reason;
      this.el.append(evEl('details', ev, { class: 'mini' },
        h('summary', null, h('strong', null, 'Compacted'), ` ${ev.messages_summarised} message${ev.messages_summarised === 1 ? '' : 's'} summarised`,
          h('span', { class: 'muted' }, ` · ${ev.before_tokens} → ${ev.after_tokens} tokens · ${why}`)),
        h('div', { class: 'muted small' }, 'The older history is sent to the model as a summary from here on; the session keeps every message, and a fork from an earlier turn gets them as they were.')));
    } else if (ev.type === 'pipeline_completed') {
      this.el.append(evEl('div', ev, { class: 'mini' }, h('strong', null, 'Run'), pill(ev.status), `${ev.steps} step${ev.steps === 1 ? '' : 's'}`,
        ev.reason ? h('span', { class: 'muted' }, `· ${ev.reason}`) : null,
        h('a', { href: `/ui/pipelines/${encodeURIComponent(ev.thread_id)}` }, `${ev.thread_id} →`)));
    }
  }
}

const TOOL_TYPES = new Set(['tool_use', 'tool_output', 'tool_result', 'approval_requested', 'approval_decided']);
const ROUND_TYPES = new Set(['round_started', 'agent_started', 'agent_completed', 'agent_failed']);
const NODE_TYPES = new Set(['node_started', 'node_completed', 'node_failed', 'route', 'checkpoint']);

export class EventLog {
  /**
   * `kind`: the session's kind; `onTurn(inTurn, turnIndex)` when a turn
   * starts or ends; `onStick(stuck)` when the reader leaves or reaches the
   * bottom; `onApproval(ev)` for each `approval_requested` and
   * `approval_decided`; `onFork(seq, button)` from a turn's Fork button
   * (none without it); `onForked(ev)` when the log starts with `forked`;
   * `resultExtra(ev)`: more to show in a turn's result (what it changed).
   */
  constructor(scroller, { kind = 'agent', onTurn, onStick, onApproval, onFork, onForked, resultExtra } = {}) {
    this.kind = kind;
    this.resultExtra = resultExtra;
    this.onTurn = onTurn;
    this.onApproval = onApproval;
    this.onFork = onFork;
    this.onForked = onForked;
    this.forked = null;
    this.vl = new VirtualList(scroller, { onStickChange: onStick });
    this.lastSeq = 0;
    this.count = 0;
    this.turns = [];
    this.inTurn = false;
    this.prompts = [];
    this.text = new Map();
    this.tools = new Map();
    this.rounds = new Map();
    this.node = null;
    this.status = null;
    this.intervention = null;
    this.decision = null;
  }

  block(b) {
    b.index = this.vl.length;
    this.vl.append(b);
    return b;
  }

  /** The turns a rewind has not undone: each has one prompt of the history. */
  liveTurns() {
    return this.turns.filter((t) => !t.undone);
  }

  setPrompts(prompts) {
    this.prompts = prompts;
    this.liveTurns().forEach((t, i) => { if (prompts[i] !== undefined) t.setPrompt(prompts[i]); });
  }

  /** Adds one event; false when it was seen already (or is not a log event). */
  add(ev) {
    if (!ev || typeof ev.seq !== 'number') return false;
    if (ev.seq <= this.lastSeq) return false;
    this.lastSeq = ev.seq;
    this.count += 1;
    // A fork's first event comes before any turn of its own.
    if (ev.type === 'forked' && !this.inTurn) {
      this.forked = this.block(new ForkedBlock(this));
      this.forked.push(ev);
      this.onForked?.(ev);
      return true;
    }
    // Files put in between turns are not a turn of their own.
    if (ev.type === 'workspace_uploaded' && !this.inTurn) {
      this.block(new NoteBlock(this, ev.type)).push(ev);
      return true;
    }
    // A rewind, before the turn it starts: the turns that ended after
    // the point it went back to are undone, and their prompts left the
    // history, so the history's prompts belong to the turns left.
    if (ev.type === 'rewound' && !this.inTurn) {
      for (const t of this.turns) if (t.endSeq > ev.to_seq) t.undo();
      this.setPrompts(this.prompts);
      this.block(new NoteBlock(this, ev.type)).push(ev);
      return true;
    }
    if (!this.inTurn) {
      this.inTurn = true;
      const t = this.block(new TurnBlock(this, this.turns.length));
      const live = this.liveTurns().length;
      if (this.prompts[live] !== undefined) t.prompt = this.prompts[live];
      this.turns.push(t);
      this.onTurn?.(true, this.turns.length - 1);
    }
    const type = ev.type;
    const agent = ev.agent_id || '';
    if (type !== 'status') this.status = null;
    if (type !== 'intervention') this.intervention = null;
    if (type !== 'text_delta' && type !== 'thinking' && type !== 'status') {
      this.text.delete(agent);
      this.text.delete(`${agent}\u0000reasoning`);
    }
    if (type === 'status') {
      if (!this.status) this.status = this.block(new StatusBlock(this));
      this.status.push(ev);
    } else if (type === 'text_delta' || type === 'thinking') {
      // Reasoning and the answer's text stream apart.
      const key = ev.reasoning ? `${agent}\u0000reasoning` : agent;
      let b = this.text.get(key);
      if (!b || b.final) {
        b = this.block(new TextBlock(this, agent, !!ev.reasoning));
        this.text.set(key, b);
      }
      b.push(ev);
      if (type === 'thinking') this.text.delete(key);
    } else if (TOOL_TYPES.has(type)) {
      // An approval names its call by `call_id`, the `id` of its tool_use.
      const id = ev.id ?? ev.call_id;
      let b = this.tools.get(id);
      if (!b) {
        b = this.block(new ToolBlock(this, id));
        this.tools.set(id, b);
      }
      b.push(ev);
      if (type.startsWith('approval_')) this.onApproval?.(ev);
    } else if (type === 'error') {
      this.block(new ErrorBlock(this)).push(ev);
    } else if (type === 'intervention') {
      if (!this.intervention) this.intervention = this.block(new InterventionBlock(this));
      this.intervention.push(ev);
    } else if (ROUND_TYPES.has(type)) {
      let b = this.rounds.get(ev.round);
      if (!b) {
        b = this.block(new RoundBlock(this, ev.round));
        this.rounds.set(ev.round, b);
      }
      b.push(ev);
    } else if (type === 'deliberation_started' || type === 'pipeline_completed' || type === 'workspace_uploaded' || type === 'compacted') {
      this.block(new NoteBlock(this, type)).push(ev);
    } else if (type === 'decision' || type === 'deliberation_completed') {
      this.block(new DecisionBlock(this)).push(ev);
    } else if (NODE_TYPES.has(type)) {
      if (type === 'node_started' || !this.node) this.node = this.block(new NodeBlock(this, ev.step));
      this.node.push(ev);
    } else if (type === 'result') {
      for (const b of this.text.values()) b.close();
      for (const b of this.tools.values()) b.close();
      this.text.clear();
      this.tools.clear();
      this.rounds.clear();
      this.node = null;
      this.block(new ResultBlock(this)).push(ev);
      const turn = this.turns[this.turns.length - 1];
      if (turn) turn.endSeq = ev.seq;
      this.inTurn = false;
      this.onTurn?.(false, this.turns.length - 1);
    } else {
      this.block(new GenericBlock(this, type)).push(ev);
    }
    return true;
  }

  /** The prompts a fork carries from its source, shown under its `forked` line. */
  setInherited(prompts) {
    this.forked?.setInherited(prompts);
  }

  scrollToBottom() {
    this.vl.scrollToBottom();
  }

  destroy() {
    this.vl.destroy();
  }
}


