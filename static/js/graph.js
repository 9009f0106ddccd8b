// A pipeline definition drawn as an SVG graph, laid out by hand: nodes in
// ranks left to right (longest path from the start over the forward edges),
// forward edges between ranks, retry (back) edges as dashed arcs below.
// update() marks the current node, the visited ones and the edges taken.

import { s } from './ui.js';

const NW = 148;
const NH = 50;
const GX = 70;
const GY = 34;
const PAD = 16;

export function edgeKey(from, to) {
  return `${from}\u2192${to}`;
}

function layout(def) {
  const nodes = [...(def.nodes || [])];
  const edges = def.edges || [];
  const out = new Map(nodes.map((n) => [n, []]));
  for (const e of edges) if (out.has(e.from) && out.has(e.to)) out.get(e.from).push(e.to);
  // Back edges: those closing a cycle in a DFS from the start.
  const back = new Set();
  const seen = new Set();
  const onStack = new Set();
  const order = [];
  const dfs = (n) => {
    seen.add(n);
    onStack.add(n);
    order.push(n);
    for (const m of out.get(n) || []) {
      if (onStack.has(m)) back.add(edgeKey(n, m));
      else if (!seen.has(m)) dfs(m);
    }
    onStack.delete(n);
  };
  if (def.start && out.has(def.start)) dfs(def.start);
  for (const n of nodes) if (!seen.has(n)) dfs(n);
  // Longest path over the forward edges, in topological order.
  const rank = new Map(nodes.map((n) => [n, 0]));
  const indeg = new Map(nodes.map((n) => [n, 0]));
  for (const [n, ms] of out) for (const m of ms) if (!back.has(edgeKey(n, m)) && n !== m) indeg.set(m, indeg.get(m) + 1);
  const queue = order.filter((n) => indeg.get(n) === 0);
  while (queue.length) {
    const n = queue.shift();
    for (const m of out.get(n) || []) {
      if (back.has(edgeKey(n, m)) || n === m) continue;
      rank.set(m, Math.max(rank.get(m), rank.get(n) + 1));
      indeg.set(m, indeg.get(m) - 1);
      if (indeg.get(m) === 0) queue.push(m);
    }
  }
  const byRank = new Map();
  for (const n of order) {
    const r = rank.get(n);
    if (!byRank.has(r)) byRank.set(r, []);
    byRank.get(r).push(n);
  }
  const rows = Math.max(1, ...[...byRank.values()].map((l) => l.length));
  const pos = new Map();
  for (const [r, list] of byRank) {
    const offset = ((rows - list.length) * (NH + GY)) / 2;
    list.forEach((n, i) => pos.set(n, { x: r * (NW + GX), y: offset + i * (NH + GY), rank: r }));
  }
  // One drawn edge per pair of nodes, with the decisions that take it.
  const pairs = new Map();
  for (const e of edges) {
    const k = edgeKey(e.from, e.to);
    if (!pairs.has(k)) pairs.set(k, { from: e.from, to: e.to, whens: [], counters: [], back: back.has(k) || e.from === e.to });
    const p = pairs.get(k);
    if (e.when) p.whens.push(e.when);
    if (e.counter) p.counters.push(e.counter);
  }
  const maxRank = Math.max(0, ...rank.values());
  return { pos, pairs: [...pairs.values()], rows, maxRank };
}

/** Builds the SVG; answers {svg, update(marks)}. */
export function buildGraph(def, { onNode } = {}) {
  const { pos, pairs, rows, maxRank } = layout(def);
  // Arcs: above for forward edges that skip ranks, below for back edges.
  let above = 0;
  let below = 0;
  const incoming = new Map();
  const shapes = pairs.map((p) => {
    const a = pos.get(p.from);
    const b = pos.get(p.to);
    if (!a || !b) return null;
    const span = Math.abs(b.rank - a.rank);
    if (p.from === p.to) {
      below = Math.max(below, 40);
      return { p, kind: 'self', a, b, depth: 34 };
    }
    if (p.back) {
      const n = incoming.get(p.to) || 0;
      incoming.set(p.to, n + 1);
      const depth = 30 + span * 20 + n * 6;
      below = Math.max(below, depth * 0.75 + 16);
      return { p, kind: 'back', a, b, depth, slot: n };
    }
    if (span > 1 || (a.y !== b.y && span === 0)) {
      const depth = 26 + span * 14;
      above = Math.max(above, depth * 0.75 + 14);
      return { p, kind: 'over', a, b, depth };
    }
    return { p, kind: 'next', a, b };
  }).filter(Boolean);
  const top = PAD + above;
  const width = PAD * 2 + (maxRank + 1) * NW + maxRank * GX;
  const height = top + rows * NH + (rows - 1) * GY + below + PAD;
  const svg = s('svg', { class: 'graph', testid: 'graph', viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': `Pipeline ${def.name}: ${def.nodes.length} nodes from ${def.start}` });
  svg.style.maxWidth = `${Math.max(width, 640)}px`;
  const defs = s('defs', null,
    s('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' }, s('path', { d: 'M0,0 L10,5 L0,10 z' })),
    s('marker', { id: 'arrow-taken', class: 'taken', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' }, s('path', { d: 'M0,0 L10,5 L0,10 z' })));
  svg.append(defs);
  const root = s('g', { transform: `translate(${PAD},${top})` });
  svg.append(root);
  const edgeEls = new Map();
  for (const sh of shapes) {
    const { p, a, b } = sh;
    let d;
    let lx;
    let ly;
    if (sh.kind === 'next') {
      const x1 = a.x + NW;
      const y1 = a.y + NH / 2;
      const x2 = b.x;
      const y2 = b.y + NH / 2;
      const mx = (x1 + x2) / 2;
      d = `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2 - 1},${y2}`;
      lx = mx;
      ly = (y1 + y2) / 2 - 6;
    } else if (sh.kind === 'over') {
      const x1 = a.x + NW / 2 + 14;
      const x2 = b.x + NW / 2 - 14;
      const y1 = a.y;
      const y2 = b.y;
      d = `M${x1},${y1} C${x1},${y1 - sh.depth} ${x2},${y2 - sh.depth} ${x2},${y2 - 1}`;
      lx = (x1 + x2) / 2;
      ly = (y1 + y2) / 2 - sh.depth * 0.75 - 4;
    } else if (sh.kind === 'self') {
      const x = a.x + NW - 24;
      const y = a.y + NH;
      d = `M${x},${y} C${x},${y + sh.depth} ${x + 34},${y + sh.depth} ${x + 20},${y + 1}`;
      lx = x + 16;
      ly = y + sh.depth * 0.75 + 10;
    } else {
      const x1 = a.x + NW / 2 + 10;
      const x2 = b.x + NW / 2 - 10 - sh.slot * 12;
      const y1 = a.y + NH;
      const y2 = b.y + NH;
      d = `M${x1},${y1} C${x1},${y1 + sh.depth} ${x2},${y2 + sh.depth} ${x2},${y2 + 1}`;
      lx = (x1 + x2) / 2;
      ly = (y1 + y2) / 2 + sh.depth * 0.75 + 11;
    }
    const label = p.whens.join(' | ');
    const title = `${p.from} → ${p.to}${label ? ` when ${label}` : ''}${p.counters.length ? ` (counts ${p.counters.join(', ')})` : ''}`;
    const g = s('g', { class: `graph-edge${p.back ? ' back' : ''}`, testid: 'graph-edge', dataset: { from: p.from, to: p.to } },
      s('title', null, title),
      s('path', { d, 'marker-end': 'url(#arrow)' }),
      label ? s('text', { x: lx, y: ly, 'text-anchor': 'middle' }, label) : null);
    root.append(g);
    edgeEls.set(edgeKey(p.from, p.to), g);
  }
  const nodeEls = new Map();
  for (const n of def.nodes) {
    const at = pos.get(n);
    const roleText = n === def.start ? 'start' : (def.terminal || []).includes(n) ? 'terminal' : '';
    const sub = s('text', { class: 'sub', x: NW / 2, y: NH / 2 + 14, 'text-anchor': 'middle' }, roleText);
    const g = s('g', { class: 'graph-node', testid: 'graph-node', dataset: { node: n }, transform: `translate(${at.x},${at.y})`, tabindex: onNode ? 0 : undefined, role: onNode ? 'button' : undefined, 'aria-label': `Node ${n}` },
      s('title', null, n),
      s('rect', { width: NW, height: NH, rx: 10 }),
      s('text', { x: NW / 2, y: NH / 2 - 1, 'text-anchor': 'middle' }, n.length > 18 ? `${n.slice(0, 17)}…` : n),
      sub);
    if (onNode) {
      g.style.cursor = 'pointer';
      g.addEventListener('click', () => onNode(n));
      g.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); onNode(n); } });
    }
    root.append(g);
    nodeEls.set(n, { g, sub, role: roleText });
  }

  /** marks: {current, visited: Set, taken: Set of edgeKey, failed, selected, visits: Map, decisions: Map,
   *  waiting: Set of nodes whose agent waits for a decision on a tool call}. */
  function update(marks) {
    for (const [n, { g, sub, role }] of nodeEls) {
      const waits = !!marks.waiting?.has(n);
      g.classList.toggle('current', marks.current === n);
      g.classList.toggle('waiting', waits);
      g.classList.toggle('visited', marks.visited.has(n) && marks.current !== n);
      g.classList.toggle('failed', marks.failed === n);
      g.classList.toggle('selected', marks.selected === n);
      g.classList.toggle('resume', marks.resumeAt === n);
      const visits = marks.visits?.get(n) || 0;
      const decision = marks.decisions?.get(n);
      const bits = [];
      if (waits) bits.push('waiting for approval');
      else if (marks.current === n) bits.push('running…');
      else if (marks.resumeAt === n) bits.push('resumes here');
      else if (decision) bits.push(decision);
      if (visits > 1) bits.push(`×${visits}`);
      const text = bits.length ? bits.join(' ') : role;
      if (sub.textContent !== text) sub.textContent = text;
    }
    for (const [k, g] of edgeEls) {
      const taken = marks.taken.has(k);
      g.classList.toggle('taken', taken);
      g.querySelector('path').setAttribute('marker-end', taken ? 'url(#arrow-taken)' : 'url(#arrow)');
    }
  }

  return { svg, update };
}
