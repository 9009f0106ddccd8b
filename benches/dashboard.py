#!/usr/bin/env python3
"""The browser half of benches/dashboard.rs: the dashboard in headless
Chromium (selenium 4, /usr/bin/chromium, /usr/bin/chromedriver), every
measurement a cold page load in a fresh browser profile.

    dashboard.py --base URL --long-one ID --long-many ID --live ID[,ID...]
                 [--runs 5] [--peer-url URL] [--no-trace]

The server and its data are prepared by the caller (benches/dashboard.rs):
sessions in the list, two sessions of 10,000 events each (one turn of
9,995 streamed words; 100 turns of 100 events) and one fresh session per
live run (`text_deltas` on, no turn yet).

Measured in the page by a probe script that Chromium runs before the
page's own scripts in every document (CDP
Page.addScriptToEvaluateOnNewDocument): a requestAnimationFrame loop from
the document's start that records every frame's time, PerformanceObserver
entries (`longtask`, `long-animation-frame`, `largest-contentful-paint`)
and, checked in each frame, the conditions below (performance.now(), from
the navigation's start). Besides, Chromium's performance log
(goog:loggingPrefs performance, with trace categories devtools.timeline
and its frame category): for each window the compositor's DrawFrame
events, the frame reporter's presented and dropped frames and the long
animation frames Chromium traced; and CDP Performance.getMetrics deltas
(main-thread task, script, layout and style time).

  list:      /ui/sessions cold: first paint and first contentful paint
             (PerformancePaintTiming); interactive = the first frame in
             which a [data-testid=session-row] is in the DOM and the
             [data-testid=new-session] button is enabled and its click
             handler toggles its aria-expanded (clicked twice, in that
             frame).
  session:   /ui/sessions/ID of a 10,000-event session: the first event
             in the DOM, the last event (seq 10,000) in the DOM and
             visible in the log's viewport; then the log scrolled from
             the bottom to the top, scrollTop -= SCROLL_STEP px every
             frame, until it stays at 0: the frame intervals of that
             window.
  live:      /ui/sessions/ID of a fresh session, once its socket is
             connected: a turn of 9,995 words is posted from this script
             (urllib, outside the page) and its 10,000 events stream in;
             the frame intervals from the POST to the frame in which the
             result (seq 10,000) is in the DOM and visible, and how long
             after the server's `result` event (its `ts`) and after this
             script read it that was.
  peer:      the peer's page (LiteLLM's admin UI) cold: first paint and
             FCP of the page it ends on, and from the first document's
             navigation start when it redirects in script.

Each part runs --runs times, the parts interleaved, after one load of
/ui/sessions and one of the peer's page that are not counted.

Prints one JSON object on stdout; progress goes to stderr. A wait that
times out exits 1 naming what did not appear, where, and what the page
showed.
"""

import argparse
import datetime
import json
import os
import sys
import threading
import time
import traceback
import urllib.request

sys.dont_write_bytecode = True

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--window-size=1280,800")
TRACE_CATEGORIES = "devtools.timeline,disabled-by-default-devtools.timeline.frame,blink.user_timing"
# How far the log scrolls each frame: a fast flick of a wheel or trackpad.
SCROLL_STEP = 100
SCROLL_MAX_FRAMES = 4000
LONG_MS = 50.0
WORDS = 9995  # + status, "You ", "said: ", thinking, result = 10,000 events


class Failure(Exception):
    pass


def log(message):
    print(f"[dashboard.py] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the probe

PROBE = r"""
(() => {
  if (window.__bench) return;
  const CFG = __CFG__;
  const B = window.__bench = {
    cfg: CFG, frames: [], longtasks: [], loafs: [], lcp: null,
    origin: performance.timeOrigin, href: location.href,
  };
  try {
    const k = '__bench_first_origin';
    const v = sessionStorage.getItem(k);
    if (!v) sessionStorage.setItem(k, String(performance.timeOrigin));
    B.firstOrigin = v ? Number(v) : performance.timeOrigin;
  } catch (e) { B.firstOrigin = performance.timeOrigin; }
  const observe = (type, f) => {
    try { new PerformanceObserver((l) => { for (const e of l.getEntries()) f(e); }).observe({ type, buffered: true }); }
    catch (e) { B['no_' + type] = String(e); }
  };
  observe('longtask', (e) => B.longtasks.push([e.startTime, e.duration]));
  observe('long-animation-frame', (e) => B.loafs.push([e.startTime, e.duration, e.blockingDuration || 0]));
  observe('largest-contentful-paint', (e) => { B.lcp = e.startTime; });
  // The app's own performance.mark()s, if it sets any.
  B.marks = {};
  observe('mark', (e) => { if (!e.name.startsWith('bench-')) B.marks[e.name] = e.startTime; });
  // Every document's paints, kept over same-tab navigations: a page that
  // redirects in script paints (or not) before the one it ends on.
  observe('paint', (e) => {
    try {
      const k = '__bench_paints';
      const all = JSON.parse(sessionStorage.getItem(k) || '[]');
      all.push([location.pathname, performance.timeOrigin, e.name, e.startTime]);
      sessionStorage.setItem(k, JSON.stringify(all));
    } catch (err) { /* no storage: this document's entries only */ }
  });

  const inView = (el, box) => {
    if (!el || !el.isConnected) return false;
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) return false;
    const b = box ? box.getBoundingClientRect() : { top: 0, bottom: innerHeight };
    return r.bottom > b.top && r.top < b.bottom;
  };
  const checks = {
    list() {
      if (B.interactive !== undefined) return;
      const row = document.querySelector('[data-testid=session-row]');
      const btn = document.querySelector('[data-testid=new-session]');
      if (!row || !btn || btn.disabled) return;
      const before = btn.getAttribute('aria-expanded');
      btn.click();
      const open = btn.getAttribute('aria-expanded');
      btn.click();
      const closed = btn.getAttribute('aria-expanded');
      B.clickToggles = before === 'false' && open === 'true' && closed === 'false';
      B.rows = document.querySelectorAll('[data-testid=session-row]').length;
      B.interactive = performance.now();
    },
    session() {
      if (B.lastVisible !== undefined) return;
      const list = document.querySelector('[data-testid=event-list]');
      if (!list) return;
      if (B.firstEvent === undefined && list.querySelector('[data-testid=event]')) B.firstEvent = performance.now();
      if (CFG.mode === 'live' && B.firstDelta === undefined && list.querySelector('[data-type=text_delta]')) B.firstDelta = performance.now();
      const last = list.querySelector(`[data-seq="${CFG.lastSeq}"]`);
      if (!last) return;
      if (B.lastInDom === undefined) B.lastInDom = performance.now();
      if (!inView(last, list)) return;
      B.lastVisible = performance.now();
      B.lastVisibleEpoch = performance.timeOrigin + B.lastVisible;
      B.events = list.querySelectorAll('[data-testid=event]').length;
      B.atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 48;
    },
    peer() {
      if (B.ready !== undefined) return;
      const button = document.querySelector('button[type=submit], form button');
      if (button && !button.disabled && inView(button)) B.ready = performance.now();
    },
  };
  checks.live = checks.session;
  const check = checks[CFG.mode] || (() => {});
  const tick = (t) => {
    B.frames.push(t);
    try { check(); } catch (e) { B.checkError = String(e); }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})();
"""

READ = r"""
const B = window.__bench;
if (!B) return null;
const paint = {};
for (const e of performance.getEntriesByType('paint')) paint[e.name] = e.startTime;
const nav = performance.getEntriesByType('navigation')[0];
let bytes = 0;
for (const e of performance.getEntriesByType('resource')) bytes += e.encodedBodySize || 0;
if (nav) bytes += nav.encodedBodySize || 0;
const out = {};
for (const k of Object.keys(B)) if (!['frames', 'longtasks', 'loafs'].includes(k)) out[k] = B[k];
out.fp = paint['first-paint'] ?? null;
out.fcp = paint['first-contentful-paint'] ?? null;
out.nav = nav ? { responseEnd: nav.responseEnd, domContentLoaded: nav.domContentLoadedEventEnd, load: nav.loadEventEnd, type: nav.type, name: nav.name } : null;
out.resources = performance.getEntriesByType('resource').length;
out.bytes = bytes;
out.href = location.href;
try { out.paints = JSON.parse(sessionStorage.getItem('__bench_paints') || '[]'); } catch (e) { out.paints = []; }
return out;
"""

FRAMES_IN = r"""
const B = window.__bench, from = arguments[0], to = arguments[1];
const f = B.frames.filter((t) => t >= from && t <= to);
return {
  frames: f,
  longtasks: B.longtasks.filter(([s, d]) => s + d >= from && s <= to),
  loafs: B.loafs.filter(([s, d]) => s + d >= from && s <= to),
};
"""

SCROLL = r"""
const [step, maxFrames, done] = arguments;
const s = document.querySelector('[data-testid=event-list]');
if (!s) { done({ error: 'no [data-testid=event-list]' }); return; }
const start = performance.now();
performance.mark('bench-window-start');
const height0 = s.scrollHeight;
const top0 = s.scrollTop;
let n = 0, atZero = 0;
const frame = () => {
  n += 1;
  atZero = s.scrollTop <= 0 ? atZero + 1 : 0;
  if (atZero >= 2 || n >= maxFrames) {
    const end = performance.now();
    performance.mark('bench-window-end');
    done({ start, end, frames: n, top0, height0, height: s.scrollHeight, top: s.scrollTop, firstInDom: !!s.querySelector('[data-seq="1"]'),
           nodes: document.getElementsByTagName('*').length });
    return;
  }
  s.scrollTop = Math.max(0, s.scrollTop - step);
  requestAnimationFrame(frame);
};
requestAnimationFrame(frame);
"""


# ---------------------------------------------------------------- browser


class Browser:
    """One Chromium with a fresh profile, the probe installed for `cfg`."""

    def __init__(self, cfg, trace):
        options = Options()
        options.binary_location = CHROMIUM
        for flag in FLAGS:
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        prefs = {"enableNetwork": False, "enablePage": False}
        if trace:
            prefs["traceCategories"] = TRACE_CATEGORIES
        options.add_experimental_option("perfLoggingPrefs", prefs)
        self.trace = trace
        try:
            self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        except WebDriverException as e:
            raise Failure(f"cannot start {CHROMIUM} through {CHROMEDRIVER}: {e.msg}") from None
        self.driver.set_script_timeout(180)
        self.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                    {"source": PROBE.replace("__CFG__", json.dumps(cfg))})
        self.driver.execute_cdp_cmd("Performance.enable", {"timeDomain": "timeTicks"})
        self.version = self.driver.capabilities.get("browserVersion", "?")

    def close(self):
        try:
            self.driver.quit()
        except WebDriverException:
            pass

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def probe(self):
        return self.js("return window.__bench ? true : false")

    def read(self):
        return self.js(READ)

    def shows(self):
        """What the page shows, to explain a failed wait."""
        try:
            text = self.js("return document.body ? document.body.innerText : '(no body)'") or ""
        except WebDriverException as e:
            text = f"(cannot read the page: {e.msg})"
        text = " ".join(text.split())
        return f"at {self.driver.current_url}, the page shows: {text[:300]!r}"

    def wait(self, what, predicate, timeout):
        """Polls `predicate` (a JS expression over B = window.__bench) every 50 ms."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.js(f"const B = window.__bench; if (!B) return null; return ({predicate});")
            except WebDriverException as e:
                value = None
                last_error = e.msg
            else:
                last_error = None
            if value:
                return value
            if time.monotonic() > deadline:
                probe = self.js("const B = window.__bench; return B ? (B.checkError || null) : 'the probe did not run'")
                raise Failure(f"{what} did not appear within {timeout} s ({self.shows()})"
                              + (f"; probe: {probe}" if probe else "")
                              + (f"; last error: {last_error}" if last_error else ""))
            time.sleep(0.05)

    def metrics(self):
        answer = self.driver.execute_cdp_cmd("Performance.getMetrics", {})
        return {m["name"]: m["value"] for m in answer.get("metrics", [])}

    def drain_log(self):
        """Every performance-log entry so far. Chromedriver hands over the
        trace buffer on a getLog that follows an emptied log (and then
        restarts tracing), at most 100,000 entries a call: call until two
        calls in a row bring nothing."""
        entries = []
        empty = 0
        for _ in range(200):
            got = self.driver.get_log("performance")
            if got:
                entries.extend(got)
                empty = 0
            else:
                empty += 1
                if empty >= 2:
                    break
        return entries

    def console_errors(self):
        try:
            return [e.get("message", "") for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]
        except WebDriverException:
            return []


def metric_delta(before, after):
    keys = ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration", "LayoutCount", "RecalcStyleCount")
    out = {k: round(after.get(k, 0) - before.get(k, 0), 6) for k in keys}
    for k in ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration"):
        out[k + "Ms"] = round(out.pop(k) * 1000, 3)
    out["Nodes"] = after.get("Nodes")
    out["JSHeapUsedMB"] = round(after.get("JSHeapUsedSize", 0) / 1e6, 2)
    return out


def trace_window(entries):
    """Chromium's own frame data between the page's bench-window-start and
    bench-window-end marks, from the performance log's trace events."""
    events = []
    warnings = []
    for entry in entries:
        try:
            message = json.loads(entry["message"])["message"]
        except (KeyError, ValueError):
            continue
        if message.get("method") == "Tracing.dataCollected":
            events.append(message["params"])
        elif message.get("method") == "Tracing.bufferUsage":
            warnings.append(message.get("params", {}).get("error", "trace buffer full"))
    marks = {e["name"]: e for e in events if e.get("cat") == "blink.user_timing"
             and e.get("name") in ("bench-window-start", "bench-window-end")}
    if len(marks) != 2:
        return {"error": f"window marks missing from the trace ({sorted(marks)}; {len(events)} events)"}
    pid = marks["bench-window-start"]["pid"]
    t0 = marks["bench-window-start"]["ts"]
    t1 = marks["bench-window-end"]["ts"]
    inside = [e for e in events if e.get("pid") == pid and t0 <= e.get("ts", 0) <= t1]
    draws = sorted(e["ts"] for e in inside if e.get("name") == "DrawFrame")
    states = {}
    for e in inside:
        if e.get("name") == "PipelineReporter" and e.get("ph") == "b":
            state = e.get("args", {}).get("frame_reporter", {}).get("state", "?")
            states[state] = states.get(state, 0) + 1
    frames = []
    for e in inside:
        if e.get("name") == "AnimationFrame" and e.get("ph") == "b":
            info = e.get("args", {}).get("animation_frame_timing_info", {})
            frames.append([info.get("duration_ms", 0), info.get("blocking_duration_ms", 0)])
    return {
        "window_ms": (t1 - t0) / 1000.0,
        "events": len(inside),
        "draw_intervals": [round((b - a) / 1000.0, 3) for a, b in zip(draws, draws[1:])],
        "draw_frames": len(draws),
        "frame_states": states,
        "animation_frames": len(frames),
        "long_animation_frames": [d for d, _ in frames if d > LONG_MS],
        "max_animation_frame_ms": max((d for d, _ in frames), default=0),
        "warnings": warnings,
    }


def intervals(frames):
    return [round(b - a, 3) for a, b in zip(frames, frames[1:])]


# ---------------------------------------------------------------- runs


def run_list(base, trace):
    browser = Browser({"mode": "list"}, trace)
    try:
        browser.driver.get(base + "/ui/sessions")
        browser.wait("a [data-testid=session-row] with an enabled [data-testid=new-session] button",
                     "B.interactive !== undefined", 30)
        browser.wait("the first contentful paint entry", "performance.getEntriesByType('paint').length >= 2", 10)
        time.sleep(0.3)  # let LCP settle
        facts = browser.read()
        if not facts.get("clickToggles"):
            raise Failure("[data-testid=new-session] did not toggle aria-expanded when clicked at the interactive frame")
        frames = browser.js(FRAMES_IN, 0, facts["interactive"])
        facts["frames_to_interactive"] = len(frames["frames"])
        facts["longtasks_to_interactive"] = [d for _, d in frames["longtasks"]]
        facts["console_errors"] = browser.console_errors()
        facts["chromium"] = browser.version
        return facts
    finally:
        browser.close()


def run_session(base, session_id, trace):
    browser = Browser({"mode": "session", "lastSeq": 10000}, trace)
    try:
        browser.driver.get(base + f"/ui/sessions/{session_id}")
        browser.wait("the session's event log ([data-testid=event-list]) with an event",
                     "B.firstEvent !== undefined", 30)
        browser.wait("the session's last event ([data-seq=\"10000\"]) in view in [data-testid=event-list]",
                     "B.lastVisible !== undefined", 60)
        facts = browser.read()
        opening = browser.js(FRAMES_IN, 0, facts["lastVisible"])
        facts["open_frames"] = intervals(opening["frames"])
        facts["open_longtasks"] = [d for _, d in opening["longtasks"]]
        time.sleep(1.0)  # settle: measured heights, the status poll
        browser.drain_log()
        before = browser.metrics()
        scroll = browser.driver.execute_async_script(SCROLL, SCROLL_STEP, SCROLL_MAX_FRAMES)
        after = browser.metrics()
        if scroll.get("error"):
            raise Failure(f"scrolling: {scroll['error']} ({browser.shows()})")
        if scroll["top"] > 0:
            raise Failure(f"scrolled {scroll['frames']} frames without reaching the top of the log "
                          f"(scrollTop {scroll['top']}, scrollHeight {scroll['height']})")
        window = browser.js(FRAMES_IN, scroll["start"], scroll["end"])
        facts["scroll"] = scroll
        facts["scroll_frames"] = intervals(window["frames"])
        facts["scroll_longtasks"] = [d for _, d in window["longtasks"]]
        facts["scroll_loafs"] = [d for _, d, _ in window["loafs"] if d > LONG_MS]
        facts["scroll_metrics"] = metric_delta(before, after)
        if trace:
            facts["scroll_trace"] = trace_window(browser.drain_log())
        facts["console_errors"] = browser.console_errors()
        return facts
    finally:
        browser.close()


def post_turn(base, session_id, prompt, out):
    """Sends the turn and reads its stream to the result, noting when this
    client read the first event and the result."""
    try:
        request = urllib.request.Request(
            f"{base}/agent/session/{session_id}/message",
            data=json.dumps({"prompt": prompt}).encode(),
            headers={"content-type": "application/json", "accept": "application/x-ndjson"})
        out["sent"] = time.time()
        with urllib.request.urlopen(request, timeout=300) as response:
            events = 0
            for line in response:
                if not line.strip():
                    continue
                event = json.loads(line)
                events += 1
                if events == 1:
                    out["first_read"] = time.time()
                    out["first_ts"] = event.get("ts")
                if event.get("type") == "result":
                    out["result_read"] = time.time()
                    out["result_ts"] = event.get("ts")
                    out["result_seq"] = event.get("seq")
                    out["status"] = event.get("status")
            out["events"] = events
    except Exception as e:  # reported by the caller
        out["error"] = f"{type(e).__name__}: {e}"


def epoch_ms(ts):
    """An event's RFC 3339 `ts` (nanoseconds) as milliseconds since the epoch."""
    if not ts:
        return None
    head, _, frac = ts.rstrip("Z").partition(".")
    seconds = datetime.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc).timestamp()
    return (seconds + float("0." + (frac or "0"))) * 1000.0


def run_live(base, session_id, trace):
    browser = Browser({"mode": "live", "lastSeq": 10000}, trace)
    try:
        browser.driver.get(base + f"/ui/sessions/{session_id}")
        browser.wait("the session's [data-testid=connection] in state connected",
                     "document.querySelector('[data-testid=connection]')?.dataset.state === 'connected'", 30)
        browser.wait("the composer's [data-testid=send] button", "document.querySelector('[data-testid=send]')", 10)
        time.sleep(0.5)
        browser.drain_log()
        before = browser.metrics()
        start = browser.js("performance.mark('bench-window-start'); return performance.now();")
        turn = {}
        prompt = " ".join(f"w{i}" for i in range(WORDS))
        thread = threading.Thread(target=post_turn, args=(base, session_id, prompt, turn), daemon=True)
        thread.start()
        browser.wait("the turn's result (seq 10000) in view in [data-testid=event-list]",
                     "B.lastVisible !== undefined", 180)
        end = browser.js("performance.mark('bench-window-end'); return window.__bench.lastVisible;")
        after = browser.metrics()
        thread.join(30)
        if turn.get("error"):
            raise Failure(f"the turn's POST failed: {turn['error']}")
        if turn.get("status") != "success" or turn.get("result_seq") != 10000:
            raise Failure(f"the turn ended with status {turn.get('status')!r} at seq {turn.get('result_seq')!r}, "
                          f"not success at 10000 ({turn.get('events')} events)")
        facts = browser.read()
        window = browser.js(FRAMES_IN, start, end)
        facts["turn"] = turn
        facts["window_start"] = start
        facts["frames_live"] = intervals(window["frames"])
        facts["longtasks_live"] = [d for _, d in window["longtasks"]]
        facts["loafs_live"] = [d for _, d, _ in window["loafs"] if d > LONG_MS]
        facts["metrics_live"] = metric_delta(before, after)
        result_ms = epoch_ms(turn.get("result_ts"))
        first_ms = epoch_ms(turn.get("first_ts"))
        facts["stream_ms"] = result_ms - first_ms if result_ms and first_ms else None
        facts["result_ts_to_visible_ms"] = facts["lastVisibleEpoch"] - result_ms if result_ms else None
        facts["result_read_to_visible_ms"] = facts["lastVisibleEpoch"] - turn["result_read"] * 1000.0
        facts["post_to_first_delta_ms"] = (facts["firstDelta"] - start) if facts.get("firstDelta") is not None else None
        if trace:
            facts["trace_live"] = trace_window(browser.drain_log())
        facts["console_errors"] = browser.console_errors()
        return facts
    finally:
        browser.close()


def run_peer(url, trace):
    browser = Browser({"mode": "peer"}, trace)
    try:
        browser.driver.get(url)
        browser.wait("the peer page's first contentful paint", "performance.getEntriesByType('paint').length >= 2", 30)
        try:
            browser.wait("the peer page's enabled submit button", "B.ready !== undefined", 15)
        except Failure as e:
            log(f"peer: {e}")
        time.sleep(0.3)
        facts = browser.read()
        facts["redirected_in_script"] = facts["firstOrigin"] < facts["origin"] - 0.5
        shift = facts["origin"] - facts["firstOrigin"]
        # The first paint of any document since the first navigation's start.
        for name, key in (("first-paint", "fp_from_first"), ("first-contentful-paint", "fcp_from_first")):
            times = [origin + at - facts["firstOrigin"] for _, origin, n, at in facts.get("paints", []) if n == name]
            facts[key] = min(times) if times else None
        facts["documents"] = sorted({(path, origin) for path, origin, _, _ in facts.get("paints", [])}, key=lambda d: d[1])
        facts["ready_from_first"] = facts["ready"] + shift if facts.get("ready") is not None else None
        facts["console_errors"] = browser.console_errors()
        return facts
    finally:
        browser.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--long-one", required=True, help="a session of one 10,000-event turn")
    parser.add_argument("--long-many", required=True, help="a session of 100 turns, 10,000 events")
    parser.add_argument("--live", required=True, help="fresh sessions, comma-separated, one per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--peer-url")
    parser.add_argument("--no-trace", action="store_true")
    parser.add_argument("--only", help="comma-separated: list,one,many,live,peer")
    args = parser.parse_args()
    base = args.base.rstrip("/")
    trace = not args.no_trace
    live = args.live.split(",")
    if len(live) < args.runs:
        raise Failure(f"{args.runs} runs need {args.runs} fresh sessions, got {len(live)}")
    only = set((args.only or "list,one,many,live,peer").split(","))
    out = {"runs": args.runs, "scroll_step_px": SCROLL_STEP, "trace": trace, "flags": FLAGS,
           "list": [], "one": [], "many": [], "live": [], "peer": []}
    # One load of each page first, not counted: both servers serve their
    # files once (the peer reads and caches its bundle on the first
    # request); every counted load is still a fresh browser profile.
    if "list" in only:
        log("warm-up: /ui/sessions")
        run_list(base, False)
    if "peer" in only and args.peer_url:
        log(f"warm-up: peer {args.peer_url}")
        run_peer(args.peer_url, False)
    for i in range(args.runs):
        # Interleaved, so a slow moment of the machine spreads over all.
        if "list" in only:
            log(f"run {i + 1}/{args.runs}: /ui/sessions")
            out["list"].append(run_list(base, trace))
        if "peer" in only and args.peer_url:
            log(f"run {i + 1}/{args.runs}: peer {args.peer_url}")
            out["peer"].append(run_peer(args.peer_url, trace))
        if "one" in only:
            log(f"run {i + 1}/{args.runs}: one turn of 10,000 events")
            out["one"].append(run_session(base, args.long_one, trace))
        if "many" in only:
            log(f"run {i + 1}/{args.runs}: 100 turns, 10,000 events")
            out["many"].append(run_session(base, args.long_many, trace))
        if "live" in only:
            log(f"run {i + 1}/{args.runs}: live, 10,000 events streaming")
            out["live"].append(run_live(base, live[i], trace))
    out["chromium"] = (out["list"] or out["one"] or [{}])[0].get("chromium")
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except Failure as e:
        print(f"dashboard.py: {e}", file=sys.stderr)
        sys.exit(1)
    except WebDriverException as e:
        traceback.print_exc()
        print(f"dashboard.py: the browser failed: {e.msg}", file=sys.stderr)
        sys.exit(1)
