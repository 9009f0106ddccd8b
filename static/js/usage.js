// Usage: what keys spent per UTC day (a bar chart of tokens, SVG drawn
// here: the page loads nothing from elsewhere) and a table by model or,
// for an admin key, by key name. A key sees its own; an admin every key's.

import * as api from './api.js';
import { h, s, put, empty, errorBox, loading, fmtInt, fmtTokens, fmtCost } from './ui.js';

const DAY_MS = 86400000;

/** `YYYY-MM-DD` of a UTC day, `back` days before today. */
function utcDay(back) {
  return new Date(Date.now() - back * DAY_MS).toISOString().slice(0, 10);
}

function tokensOf(g) {
  return (g.input_tokens || 0) + (g.output_tokens || 0);
}

/** Bars of tokens per day, every day of the range (a day without usage
 *  has a bar of height 0), scaled to the busiest. */
function chart(days, byDay) {
  const width = 640, height = 160, pad = 22;
  const most = Math.max(1, ...days.map((d) => tokensOf(byDay.get(d) || {})));
  const step = (width - 2 * pad) / days.length;
  const barW = Math.max(2, step * 0.7);
  const bars = days.map((day, i) => {
    const tokens = tokensOf(byDay.get(day) || {});
    const barH = Math.round((height - 2 * pad) * tokens / most);
    const x = pad + i * step + (step - barW) / 2;
    return s('g', null,
      s('rect', { class: 'usage-bar', x, y: height - pad - barH, width: barW, height: Math.max(barH, 0),
        dataset: { day, tokens: String(tokens) }, testid: 'usage-bar' },
      s('title', null, `${day}: ${fmtInt(tokens)} tokens`)),
      (days.length <= 14 || i % Math.ceil(days.length / 10) === 0)
        ? s('text', { x: x + barW / 2, y: height - 6, 'text-anchor': 'middle', class: 'usage-axis' }, day.slice(5))
        : null);
  });
  return s('svg', { class: 'usage-chart', viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': `Tokens per day, ${days[0]} to ${days[days.length - 1]}; the busiest day ${fmtInt(most)}`,
    testid: 'usage-chart' },
  s('line', { x1: pad, x2: width - pad, y1: height - pad, y2: height - pad, class: 'usage-axis-line' }),
  ...bars);
}

function table(groups, by) {
  const head = { model: 'Model', key: 'Key' }[by];
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
    h('thead', null, h('tr', null, h('th', null, head), h('th', { class: 'num' }, 'Tokens in'), h('th', { class: 'num' }, 'Tokens out'),
      h('th', { class: 'num' }, 'Cost'), h('th', { class: 'num' }, 'Turns'), h('th', { class: 'num hide-sm' }, 'Tool calls'),
      h('th', { class: 'num hide-sm' }, 'Sandbox CPU s'), h('th', { class: 'num hide-sm' }, 'Sandbox wall s'))),
    h('tbody', null, ...groups.map((g) => h('tr', { testid: 'usage-row', dataset: { group: g.group } },
      h('td', { class: by === 'model' ? 'mono small' : '' }, by === 'model' && g.group === '-' ? 'sandboxes' : g.group),
      h('td', { class: 'num' }, fmtTokens(g.input_tokens)), h('td', { class: 'num' }, fmtTokens(g.output_tokens)),
      h('td', { class: 'num' }, fmtCost(g.cost_usd)), h('td', { class: 'num' }, fmtInt(g.turns)),
      h('td', { class: 'num hide-sm' }, fmtInt(g.tool_calls)),
      h('td', { class: 'num hide-sm', testid: 'usage-cpu' }, (g.sandbox_cpu_s || 0).toFixed(2)),
      h('td', { class: 'num hide-sm' }, (g.sandbox_wall_s || 0).toFixed(1)))))));
}

export function mount(main, params, ctx) {
  let alive = true;
  const range = h('select', { testid: 'usage-range', 'aria-label': 'Days shown' },
    ...[7, 30, 90].map((n) => h('option', { value: String(n) }, `Last ${n} days`)));
  const by = h('select', { testid: 'usage-by', 'aria-label': 'Table by' },
    h('option', { value: 'model' }, 'By model'),
    ctx.admin ? h('option', { value: 'key' }, 'By key') : null);
  const summary = h('span', { class: 'muted small', testid: 'usage-total' });
  const chartBox = h('div', null, loading('Loading usage…'));
  const tableBox = h('div');
  put(main,
    h('div', { class: 'page-head' },
      h('div', { class: 'grow' }, h('h1', null, 'Usage'),
        h('p', { class: 'sub' }, ctx.admin ? 'What every key spent per UTC day: tokens, cost, turns, tool calls, sandbox time.' : 'What your key spent per UTC day: tokens, cost, turns, tool calls, sandbox time.')),
      summary, h('div', { class: 'filters' }, range)),
    h('div', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', { class: 'grow' }, 'Tokens per day')), chartBox),
    h('div', { class: 'card', style: { marginTop: '16px' } }, h('div', { class: 'card-head' }, h('h2', { class: 'grow' }, 'Breakdown'), h('div', { class: 'filters' }, by)), tableBox));

  async function refresh() {
    const n = Number(range.value);
    const from = utcDay(n - 1), to = utcDay(0);
    try {
      const [daily, split] = await Promise.all([
        api.get(`/usage${api.qs({ from, to, group_by: 'day' })}`),
        api.get(`/usage${api.qs({ from, to, group_by: by.value })}`),
      ]);
      if (!alive) return;
      const days = Array.from({ length: n }, (_, i) => utcDay(n - 1 - i));
      const byDay = new Map(daily.groups.map((g) => [g.group, g]));
      summary.textContent = `${fmtInt(tokensOf(daily.total))} tokens · ${fmtCost(daily.total.cost_usd)} · ${fmtInt(daily.total.turns)} turns`;
      put(chartBox, chart(days, byDay));
      put(tableBox, split.groups.length ? table(split.groups, by.value)
        : empty('No usage yet', 'Turns, gateway calls and sandboxes are counted here as they finish.'));
    } catch (e) {
      if (alive) put(chartBox, errorBox(e, refresh));
    }
  }
  range.addEventListener('change', refresh);
  by.addEventListener('change', refresh);
  const stop = api.poll(refresh, 5000);
  return () => { alive = false; stop(); };
}
