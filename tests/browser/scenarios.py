"""The dashboard's browser scenarios; run.py is the entry point.

Each `scenario_NAME(browser, args)` drives the page like a person would and
answers facts for the JSON line, raising Failure when an expectation does
not hold.
"""

import re
import time
import urllib.parse

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys


class Failure(Exception):
    """A scenario's expectation that did not hold."""


NAMES = ["sessions", "deliberations", "pipelines", "pipeline_approvals", "gateway", "views", "auth", "bigsession", "interventions", "approvals", "fork", "usage", "workspace", "rollback"]

CODE_PROMPT = "```python\nprint('hello from the sandbox', 6 * 7)\n```"
LONG_PROMPT = " ".join(f"word{i}" for i in range(1, 401))
# The demo model echoes it: markup in an answer, which must stay text.
XSS_PROMPT = 'look <img src="x" onerror="window.__conclave_xss = 1"> here'


# ---------- helpers ----------

def wait_connected(b, timeout=20):
    b.wait(lambda: any(el.get_attribute("data-state") == "connected" for el in b.css('[data-testid="connection"]')),
           timeout, "the connection element to say connected")


def open_new_session(b):
    """Makes a session from the Sessions page's defaults and waits for its
    page to be live; its id."""
    b.open("/ui/sessions")
    b.click("new-session")
    b.click("create-session")
    b.wait(lambda: b.path().startswith("/ui/sessions/"), 15, "the new session's page")
    wait_connected(b)
    return b.path().rsplit("/", 1)[1]


def max_seq(b):
    return b.driver.execute_script(
        "let m = 0; for (const el of document.querySelectorAll('[data-seq]')) m = Math.max(m, Number(el.dataset.seq)); return m;")


def events_after(b, seq, kind):
    """The rendered events of `kind` with a seq above `seq`: [{seq, text, status}]."""
    return b.driver.execute_script(
        """
        const [after, kind] = arguments;
        return [...document.querySelectorAll(`[data-type="${kind}"]`)]
          .filter((el) => Number(el.dataset.seq) > after)
          .map((el) => ({seq: Number(el.dataset.seq), text: el.textContent, status: el.dataset.status || el.closest('[data-status]')?.dataset.status || null}));
        """, seq, kind)


def send_prompt(b, text, via="click"):
    box = b.tid("prompt")
    b.set_value(box, text)
    if via == "enter":
        box.send_keys(Keys.ENTER)
    else:
        b.click("send")
    # The composer empties once the message is on its way.
    b.wait(lambda: b.tid("prompt").get_attribute("value") == "", 10, "the composer to send the message")


def wait_result(b, after, timeout, status=None):
    def found():
        results = events_after(b, after, "result")
        return results[-1] if results else None
    r = b.wait(found, timeout, f"a result after seq {after}")
    if status and r["status"] != status:
        raise Failure(f"the result after seq {after} is {r['status']!r}, expected {status!r}")
    return r


def wait_streaming(b, after, n=20, timeout=30):
    b.wait(lambda: len(events_after(b, after, "text_delta")) >= n, timeout, f"{n} text_delta events after seq {after}")


def collect_seqs(b):
    """Scrolls the virtualised log from top to bottom and answers every
    data-seq seen, and any seq shown twice at one time."""
    return b.driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const sc = document.querySelector('[data-testid="event-list"]');
        const all = new Set();
        const dups = [];
        let mostInDom = 0;
        const frames = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        const snap = () => {
          const seen = new Set();
          const els = document.querySelectorAll('[data-testid="event-list"] [data-seq]');
          mostInDom = Math.max(mostInDom, els.length);
          for (const el of els) {
            const s = Number(el.dataset.seq);
            if (seen.has(s)) dups.push(s);
            seen.add(s);
            all.add(s);
          }
        };
        (async () => {
          sc.scrollTop = 0;
          await frames(); await frames();
          let steps = 0;
          for (;;) {
            snap();
            if (sc.scrollTop + sc.clientHeight >= sc.scrollHeight - 2 || steps > 20000) break;
            sc.scrollTop += Math.max(80, Math.floor(sc.clientHeight * 0.6));
            steps += 1;
            await frames();
          }
          await frames(); snap();
          done({seqs: [...all].sort((a, b) => a - b), dups, steps, mostInDom});
        })();
        """)


def check_contiguous(seqs, dups, last_seq):
    if dups:
        raise Failure(f"events shown twice: seqs {sorted(set(dups))[:20]}")
    if not seqs:
        raise Failure("no event on the page")
    expected = list(range(1, last_seq + 1))
    if seqs != expected:
        missing = sorted(set(expected) - set(seqs))[:20]
        extra = sorted(set(seqs) - set(expected))[:20]
        raise Failure(f"seqs are not 1..{last_seq}: missing {missing}, extra {extra}")


# ---------- sessions ----------

def scenario_sessions(b, args):
    t = {}
    start = time.monotonic()
    b.open("/")
    b.wait(lambda: b.path() == "/ui/sessions", 15, "/ to go to /ui/sessions")
    b.wait(lambda: b.css('[data-testid="session-row"]') or b.css('[data-testid="empty"]'), 15, "the session list or its empty state")
    b.click("new-session")
    b.click("create-session")
    b.wait(lambda: b.path().startswith("/ui/sessions/"), 15, "the new session's page")
    sid = b.path().rsplit("/", 1)[1]
    wait_connected(b)
    t["created_s"] = round(time.monotonic() - start, 2)

    # A tool call in the docker sandbox, with its output and the result.
    mark = max_seq(b)
    step = time.monotonic()
    send_prompt(b, CODE_PROMPT)
    b.wait(lambda: any("hello from the sandbox 42" in e["text"] for e in events_after(b, mark, "tool_result")),
           120, "the tool_result with 'hello from the sandbox 42'")
    first = wait_result(b, mark, 60, "success")
    t["tool_turn_s"] = round(time.monotonic() - step, 2)
    if not b.css('[data-testid="result"]'):
        raise Failure("no element has data-testid=result")
    b.shot("session-chat")

    # What a model or a tool says is text, never markup: an answer carrying
    # HTML shows as written and runs nothing.
    mark = first["seq"]
    send_prompt(b, XSS_PROMPT)
    first = wait_result(b, mark, 60, "success")
    if b.driver.execute_script("return window.__conclave_xss === 1"):
        raise Failure("markup from a model's answer ran in the page")
    if b.css('[data-testid="event"] img[src="x"]'):
        raise Failure("markup from a model's answer became an element")
    shown = b.driver.execute_script(
        "return [...document.querySelectorAll('[data-seq]')].map((el) => el.textContent).join(' ')")
    if "onerror=" not in shown:
        raise Failure("the answer's markup is not shown as text")

    # A long turn, stopped with the interrupt button.
    mark = first["seq"]
    step = time.monotonic()
    send_prompt(b, LONG_PROMPT, via="enter")
    wait_streaming(b, mark)
    b.click("interrupt")
    interrupted = wait_result(b, mark, 30, "interrupted")
    t["interrupt_s"] = round(time.monotonic() - step, 2)

    # Another, stopped with Escape.
    mark = interrupted["seq"]
    send_prompt(b, LONG_PROMPT)
    wait_streaming(b, mark)
    ActionChains(b.driver).send_keys(Keys.ESCAPE).perform()
    escaped = wait_result(b, mark, 30, "interrupted")

    # A third, with the page reloaded in the middle: the turn goes on and
    # the page shows each event once.
    mark = escaped["seq"]
    step = time.monotonic()
    send_prompt(b, LONG_PROMPT)
    wait_streaming(b, mark, 40)
    b.driver.refresh()
    wait_connected(b)
    final = wait_result(b, mark, 60, "success")
    t["reload_turn_s"] = round(time.monotonic() - step, 2)

    status, body = b.api("GET", f"/agent/session/{sid}/status")
    if status != 200:
        raise Failure(f"status of {sid}: {status} {body}")
    last_seq = body["last_seq"]
    got = collect_seqs(b)
    check_contiguous(got["seqs"], got["dups"], last_seq)
    if final["seq"] != last_seq:
        raise Failure(f"the last result is seq {final['seq']}, the session's last_seq {last_seq}")

    b.open("/ui/sessions")
    row = b.one(f'[data-testid="session-row"][data-session-id="{sid}"]', 15)
    b.shot("sessions-list")
    return {
        "session_id": sid,
        "events": last_seq,
        "most_events_in_dom": got["mostInDom"],
        "row_text": " ".join(row.text.split()),
        "timings": t,
    }


# ---------- deliberations ----------

def scenario_deliberations(b, args):
    start = time.monotonic()
    b.open("/ui/deliberations")
    task = b.tid("task-input")
    b.set_value(task, "Name one sorting algorithm and say when it is the right choice.")
    b.set_value(b.tid("agents-input"), "3")
    b.set_value(b.tid("rounds-input"), "1")
    b.set_value(b.tid("aggregate-input"), "judge")
    b.click("submit-deliberation")
    b.wait(lambda: b.path().startswith("/ui/deliberations/") and len(b.path()) > len("/ui/deliberations/"), 15, "the deliberation's page")
    task_id = b.path().rsplit("/", 1)[1]

    def round_done(n):
        cards = b.css(f'[data-testid="proposal"][data-round="{n}"]')
        return len(cards) >= 3 and all(c.get_attribute("data-status") == "done" for c in cards)

    b.wait(lambda: round_done(0), 60, "3 proposals of round 0")
    proposals_at = round(time.monotonic() - start, 2)
    agents = sorted(c.get_attribute("data-agent") for c in b.css('[data-testid="proposal"][data-round="0"]'))
    decision = b.tid("decision", 120)
    b.wait(lambda: b.one('[data-testid="deliberation-status"]').get_attribute("data-status") == "COMPLETED", 30, "COMPLETED")
    reasoning = b.tid("decision-reasoning").text
    round1 = len(b.css('[data-testid="proposal"][data-round="1"]'))
    b.driver.execute_script("window.scrollTo(0, 0)")
    b.shot("deliberation")
    return {
        "task_id": task_id,
        "agents": agents,
        "round1_proposals": round1,
        "decision": " ".join(decision.text.split())[:160],
        "reasoning": reasoning,
        "proposals_s": proposals_at,
    }


# ---------- pipelines ----------

def scenario_pipelines(b, args):
    start = time.monotonic()
    b.open("/ui/pipelines")
    select = b.tid("pipeline-select")
    b.wait(lambda: "connector" in [o.get_attribute("value") for o in select.find_elements("css selector", "option")], 15, "the connector pipeline in the list")
    b.set_value(select, "connector")
    b.set_value(b.tid("connector-name"), "stripe")
    b.set_value(b.tid("pipeline-request"), "Sync charges and refunds")
    b.wait(lambda: b.tid("start-form").get_attribute("data-test-mode"), 15, "the orchestrator's health")
    mock = [el for el in b.css('[data-testid="mock-delay"]') if el.is_displayed()]
    if mock:
        b.set_value(mock[0], "300")
    b.click("start-pipeline")
    b.wait(lambda: b.path().startswith("/ui/pipelines/pipeline-"), 15, "the run's page")
    thread = urllib.parse.unquote(b.path().rsplit("/", 1)[1])
    b.tid("graph")
    saw_current = None
    if mock:
        # One query reads the node: a node is current for ~300 ms, so a second
        # query after the wait can find none.
        def current_node():
            nonlocal saw_current
            for el in b.css('[data-testid="graph-node"].current'):
                try:
                    saw_current = el.get_attribute("data-node")
                except StaleElementReferenceException:
                    continue
                return True
            return False

        try:
            b.wait(current_node, 10, "a node running now")
        except Failure:
            saw_current = None
    b.wait(lambda: b.tid("run-status").get_attribute("data-status") == "completed", 90, "run-status completed")
    done_s = round(time.monotonic() - start, 2)
    expected = {"research", "generator", "tester", "test_reviewer", "reviewer", "publisher"}

    def visited():
        return {el.get_attribute("data-node") for el in b.css('[data-testid="graph-node"]')
                if "visited" in (el.get_attribute("class") or "").split()}

    b.wait(lambda: visited() >= expected, 10, f"the nodes {sorted(expected)} marked visited")
    b.wait(lambda: len(b.css('[data-testid="history-step"]')) == 6, 10, "6 history steps")
    taken = [f'{el.get_attribute("data-from")}>{el.get_attribute("data-to")}' for el in b.css('[data-testid="graph-edge"].taken')]
    if len(taken) != 5:
        raise Failure(f"{len(taken)} edges taken, expected 5: {taken}")
    if b.css('[data-testid="graph-node"].current'):
        raise Failure("a node is still marked current after the run completed")
    steps = [el.get_attribute("data-node") for el in b.css('[data-testid="history-step"]')]
    third = b.css('[data-testid="history-step"]')[2]
    b.click(third)
    b.wait(lambda: "Step 3" in b.tid("step-state").text and "tests" in b.tid("step-state").text, 10, "the state of step 3")
    state_text = " ".join(b.tid("step-state").text.split())
    # The header: the steps' own times, then the run's, finished.
    run_times = " ".join(b.tid("run-times").text.split())
    if not re.fullmatch(r"· .+ in steps · .+ in all", run_times):
        raise Failure(f"the run's times read {run_times!r}")
    if mock and run_times.startswith("· 0 ms"):
        raise Failure(f"six steps of 300 ms each took no time: {run_times!r}")
    b.shot("pipeline")
    return {
        "thread_id": thread,
        "visited": sorted(visited()),
        "taken": taken,
        "steps": steps,
        "saw_current": saw_current,
        "step3_state": state_text[:200],
        "run_times": run_times,
        "completed_s": done_s,
    }


def row_state(b, rid):
    return b.attr(f'[data-testid="replica-row"][data-replica="{rid}"]', "data-state")


# ---------- gateway ----------

def scenario_gateway(b, args):
    b.open("/ui/gateway")
    b.one('[data-testid="replica-row"][data-replica="r1"]', 20)
    b.one('[data-testid="replica-row"][data-replica="r2"]', 20)
    pool = b.attr('[data-testid="replica-row"][data-replica="r1"]', "data-pool")
    # Some traffic, so the latency sparklines have points.
    calls = []
    for i in range(8):
        status, body = b.api("POST", "/v1/chat/completions", {"model": pool, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 8})
        calls.append(status)
    b.wait(lambda: len(b.css('[data-testid="trace-row"]')) >= 8, 15, "the traces of 8 calls")
    b.wait(lambda: b.css('[data-testid="replica-row"][data-replica="r1"] [data-testid="sparkline"] polyline'), 15, "a latency sparkline with points")
    b.click_css('[data-testid="trace-row"]')
    b.one(".trace-detail", 5)
    b.driver.execute_script("window.scrollTo(0, 0)")
    b.shot("gateway")

    # Drain r1: the API answers "draining"; with no call in flight the
    # gateway takes it out of the pool at once, and the row says so.
    b.click_css('[data-testid="replica-row"][data-replica="r1"] [data-testid="drain"]')
    b.wait(lambda: row_state(b, "r1") in ("draining", "removed"), 15, "r1 draining")
    after_drain = row_state(b, "r1")
    b.click_css('[data-testid="replica-row"][data-replica="r1"] [data-testid="resume"]')
    # Back to active, or (for a removed replica whose URL the server's
    # gateway.allowed_upstreams refuses at run time) the refusal shown.
    b.wait(lambda: row_state(b, "r1") == "active" or b.css(".toast.danger"), 10, "r1 active again, or the reason it cannot be")
    readded = row_state(b, "r1") == "active"
    refusal = None if readded else (b.text(".toast.danger") or [None])[-1]

    # Pause and resume r2.
    b.click_css('[data-testid="replica-row"][data-replica="r2"] [data-testid="pause"]')
    b.wait(lambda: row_state(b, "r2") == "paused", 10, "r2 paused")
    b.click_css('[data-testid="replica-row"][data-replica="r2"] [data-testid="resume"]')
    b.wait(lambda: row_state(b, "r2") == "active", 10, "r2 active again")
    return {
        "pool": pool,
        "calls": calls,
        "r1_after_drain": after_drain,
        "r1_back": readded,
        "r1_refusal": refusal,
        "r2_paused_and_resumed": True,
        "sparklines": len(b.css('[data-testid="sparkline"]')),
    }


# ---------- the other views ----------

def scenario_views(b, args):
    facts = {}
    b.open("/ui/sandboxes")
    b.wait(lambda: b.css('[data-testid="sandbox-row"]'), 30, "a sandbox row")
    rows = b.css('[data-testid="sandbox-row"]')
    facts["sandboxes"] = len(rows)
    # CPU use shows to one decimal ("0.3 %"), not as the backend's float;
    # the first sample comes a poll or two after the view opens.
    rounded = re.compile(r"^\d+\.\d %$")
    cpu = lambda: b.css('[data-testid="sandbox-row"] [data-testid="sandbox-cpu"]')[0].text.strip()
    b.wait(lambda: rounded.match(cpu()), 30, "the sandbox's CPU use, rounded")
    facts["sandbox_cpu"] = cpu()
    facts["sandbox_row"] = " ".join(b.css('[data-testid="sandbox-row"]')[0].text.split())
    b.shot("sandboxes")
    # The session's page shows the same sandbox the same way.
    session = b.css('[data-testid="sandbox-row"]')[0].get_attribute("data-session")
    if session:
        b.open(f"/ui/sessions/{session}")
        shown = b.tid("sandbox-cpu").text.strip()
        if not rounded.match(shown):
            raise Failure(f"the session's sandbox card shows CPU as {shown!r}")
        facts["session_sandbox_cpu"] = shown

    b.open("/ui/bus")
    pattern = b.tid("pattern-input")
    b.set_value(pattern, ">")
    b.click("subscribe")
    wait_connected(b)
    b.api("PUT", "/kv/dashboard/greeting", {"hello": "from the browser test"})
    subject = f"dashboard.test.{int(time.time() * 1000) % 100000}"
    status, body = b.api("POST", f"/bus/publish/{subject}", {"n": 1, "note": "published by the browser test"})
    if status != 202:
        raise Failure(f"publishing on {subject}: {status} {body}")
    b.one(f'[data-testid="bus-message"][data-subject="{subject}"]', 15)
    b.api("POST", f"/bus/publish/{subject}", {"n": 2})
    b.wait(lambda: len(b.css(f'[data-testid="bus-message"][data-subject="{subject}"]')) == 2, 15, "the second message")
    b.wait(lambda: b.css('[data-testid="kv-row"][data-key="dashboard/greeting"]'), 15, "the KV row")
    facts["bus_messages"] = len(b.css('[data-testid="bus-message"]'))
    facts["kv_rows"] = len(b.css('[data-testid="kv-row"]'))
    b.shot("bus")

    b.open("/ui/gateway")
    b.wait(lambda: b.css('[data-testid="replica-row"]') or b.css('[data-testid="empty"]'), 15, "the gateway view")
    b.shot("gateway")
    b.open("/ui/pipelines")
    b.wait(lambda: b.css('[data-testid="run-row"]') or b.css('[data-testid="empty"]'), 15, "the pipelines view")
    b.shot("pipelines")
    return facts


# ---------- auth ----------

def scenario_auth(b, args):
    if not args.key or not args.wrong_key:
        raise Failure("the auth scenario needs --key and --wrong-key")
    b.open("/")
    key_input = b.tid("key-input")
    b.shot("key-form")
    if b.css('[data-testid="nav-sessions"]') or b.css('[data-testid="session-row"]'):
        raise Failure("the page shows the app before a key was given")

    key_input.send_keys(args.wrong_key)
    b.click("key-submit")
    error = b.tid("auth-error")
    b.wait(lambda: error.text.strip() != "", 10, "the auth error text")
    error_text = error.text.strip()
    if b.css('[data-testid="session-row"]') or b.css('[data-testid="nav-sessions"]'):
        raise Failure("a wrong key shows the session list")

    key_input = b.tid("key-input")
    key_input.clear()
    key_input.send_keys(args.key)
    b.click("key-submit")
    b.tid("nav-sessions", 15)
    b.wait(lambda: b.path() == "/ui/sessions", 10, "the sessions view")
    b.wait(lambda: b.css('[data-testid="empty"]') or b.css('[data-testid="session-row"]'), 15, "the session list")
    if not b.css('[data-testid="empty"]'):
        raise Failure(f"key A has no session, yet the list shows {len(b.css('[data-testid=session-row]'))} row(s)")
    if "secret-of-b" in b.driver.page_source:
        raise Failure("another key's session is on the page")
    stored = b.driver.execute_script("return sessionStorage.getItem('conclave.key')")
    if stored != args.key:
        raise Failure("the key is not kept in sessionStorage under conclave.key")

    # A session of key A, opened live: its socket goes with a ticket.
    b.click("new-session")
    b.click("create-session")
    b.wait(lambda: b.path().startswith("/ui/sessions/"), 15, "the new session")
    wait_connected(b)
    send_prompt(b, "hello with a key")
    wait_result(b, 0, 30, "success")

    # Reloading keeps the key for the tab (no new sign-in).
    b.driver.refresh()
    wait_connected(b)

    b.drain_logs()
    leaked = [u for u in b.requested + b.sockets if args.key in u or args.wrong_key in u or urllib.parse.quote(args.key) in u]
    if leaked:
        raise Failure(f"a key appeared in a URL: {leaked[:3]}")
    ticketed = [u for u in b.sockets if "ticket=" in u]
    if not ticketed:
        raise Failure(f"no WebSocket was opened with a ticket: {b.sockets}")
    if any("token=" in u for u in b.sockets):
        raise Failure("a WebSocket carried token=")
    return {
        "auth_error": error_text,
        "requests_checked": len(b.requested),
        "sockets": len(b.sockets),
        "sockets_with_ticket": len(ticketed),
        "_allow_console": ("401",),
    }


# ---------- a big session (a server with demo.chunk_delay_ms = 0) ----------

def scenario_bigsession(b, args):
    """Makes a session of at least 10,000 events through the API, then opens
    it and scrolls it end to end, timing the frames."""
    b.open("/ui/sessions")
    b.tid("new-session")
    status, body = b.api("POST", "/agent/session", {"session_name": "big", "options": {"text_deltas": True}})
    sid = body["session_id"]
    words = " ".join(f"w{i}" for i in range(18))
    turns = 0
    last = 0
    while last < 10000:
        status, _ = b.api("POST", f"/agent/session/{sid}/message", {"prompt": f"turn {turns} {words}"})
        if status != 200:
            raise Failure(f"turn {turns}: {status}")
        turns += 1
        if turns % 50 == 0 or last > 9000:
            _, st = b.api("GET", f"/agent/session/{sid}/status")
            last = st["last_seq"]
    _, st = b.api("GET", f"/agent/session/{sid}/status")
    last = st["last_seq"]
    start = time.monotonic()
    b.open(f"/ui/sessions/{sid}")
    b.wait(lambda: max_seq(b) == last, 60, f"event {last} on the page")
    open_s = round(time.monotonic() - start, 2)
    timing = b.driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const sc = document.querySelector('[data-testid="event-list"]');
        const gaps = [];
        let prev = performance.now();
        let most = 0;
        const frame = () => new Promise((r) => requestAnimationFrame((t) => { gaps.push(t - prev); prev = t; r(); }));
        (async () => {
          sc.scrollTop = 0; await frame(); await frame();
          prev = performance.now();
          const t0 = performance.now();
          while (sc.scrollTop + sc.clientHeight < sc.scrollHeight - 2) {
            sc.scrollTop += sc.clientHeight * 0.9;
            await frame();
            most = Math.max(most, document.querySelectorAll('[data-testid="event-list"] [data-seq]').length);
          }
          gaps.sort((a, b) => a - b);
          done({frames: gaps.length, p50: gaps[Math.floor(gaps.length / 2)], p95: gaps[Math.floor(gaps.length * 0.95)], max: gaps[gaps.length - 1], total_ms: performance.now() - t0, most_in_dom: most,
                dom_nodes: document.getElementsByTagName('*').length});
        })();
        """)
    got = collect_seqs(b)
    check_contiguous(got["seqs"], got["dups"], last)
    # Timings are facts for the benchmark, not assertions (a noisy machine
    # would make them flaky); what keeps the page responsive is that only a
    # window of the 10,000 events is ever in the DOM.
    if timing["most_in_dom"] > 1000:
        raise Failure(f"the list is not virtualised: {timing['most_in_dom']} events in the DOM at once")
    return {"session_id": sid, "events": last, "turns": turns, "open_s": open_s, "scroll": {k: round(v, 1) if isinstance(v, float) else v for k, v in timing.items()}}


def scenario_interventions(b, args):
    """A session of the demo model under the small harness (`demo-small`,
    which the test configures): a Python cell that would fail runs
    repaired, and the chat shows the harness's intervention as such,
    apart from the model's text."""
    b.open("/ui/sessions")
    b.tid("new-session")
    status, body = b.api("POST", "/agent/session", {"session_name": "small", "options": {"model": "demo-small"}})
    if status not in (200, 201):
        raise Failure(f"creating the session answered {status}: {body}")
    sid = body["session_id"]
    b.open(f"/ui/sessions/{sid}")
    wait_connected(b)
    mark = max_seq(b)
    send_prompt(b, "```python\nprint('shout').upper()\n```")
    wait_result(b, mark, 120, "success")
    said = b.wait(lambda: len(events_after(b, mark, "intervention")) >= 2, 10, "two intervention events in the chat")
    said = events_after(b, mark, "intervention")
    text = said[0]["text"]
    if "Harness" not in text or "cell repaired" not in text or "print() returns None" not in text:
        raise Failure(f"the intervention reads {text!r}")
    b.shot("session-intervention")
    return {"interventions": len(said)}


# In a module of its own to keep files short; imported last, once the
# helpers it uses are defined.
from approvals import scenario_approvals, scenario_pipeline_approvals  # noqa: E402,F401
from fork import scenario_fork  # noqa: E402,F401
from rollback import scenario_rollback  # noqa: E402,F401
from usage import scenario_usage  # noqa: E402,F401
from workspace import scenario_workspace  # noqa: E402,F401
