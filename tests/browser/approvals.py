"""The approvals scenario (issue 37): tool calls that wait for a person's
decision in the chat, decided by a click, by keys and by another client.
scenarios.py lists it; it is apart only to keep files short."""

import time

from selenium.webdriver.common.action_chains import ActionChains

from scenarios import Failure, events_after, max_seq, send_prompt, wait_connected, wait_result

# One read of the waiting card, in a single script so a live update
# cannot make it stale halfway.
PENDING_JS = """
const c = document.querySelector('[data-testid="approval"][data-state="pending"]');
if (!c) return null;
const q = (t) => c.querySelector(`[data-testid="${t}"]`)?.textContent || '';
const allow = c.querySelector('[data-testid="approval-allow"]');
const focused = document.activeElement === allow;
return {call_id: c.dataset.callId, tool: q('approval-tool'), input: q('approval-input'), reason: q('approval-reason'),
        expires: q('approval-expires'), focused, ring: focused ? getComputedStyle(allow).outlineStyle : null,
        buttons: [...c.querySelectorAll('button[data-testid]')].map((x) => x.dataset.testid)};
"""

DECIDED_JS = """
const c = document.querySelector(`[data-testid="approval"][data-call-id="${CSS.escape(arguments[0])}"]`);
if (!c || c.dataset.state !== arguments[1]) return null;
return {outcome: c.querySelector('[data-testid="approval-outcome"]')?.textContent || '', sent: c.dataset.sent || null,
        buttons: c.querySelectorAll('[data-testid="approval-allow"],[data-testid="approval-deny"],[data-testid="approval-always"]').length};
"""


def waiting(b, command, focused=False):
    """The card of the call running `command`, once it waits (and, with
    `focused`, once its Approve button has the focus)."""
    def found():
        card = b.driver.execute_script(PENDING_JS)
        if not card or (focused and not card["focused"]):
            return None
        return card
    card = b.wait(found, 30, f"the call of {command!r} to wait for a decision" + (" with the focus on Approve" if focused else ""))
    if card["tool"] != "Bash" or f'"command": "{command}"' not in card["input"]:
        raise Failure(f"the waiting card shows {card}")
    if not card["reason"] or "expires in" not in card["expires"]:
        raise Failure(f"the waiting card has no reason or expiry: {card}")
    if card["buttons"] != ["approval-allow", "approval-deny", "approval-always"]:
        raise Failure(f"the waiting card's buttons are {card['buttons']}")
    return card


def decided(b, call_id, state, sent=None):
    """The card of `call_id` once it shows `state` and no buttons (and,
    with `sent`, once the socket's approval_sent reply reached it)."""
    def found():
        card = b.driver.execute_script(DECIDED_JS, call_id, state)
        return card if card and (sent is None or card["sent"] == sent) else None
    card = b.wait(found, 30, f"the card of {call_id} to show {state!r}")
    if card["buttons"]:
        raise Failure(f"the decided card of {call_id} still has buttons: {card}")
    return card


def ran(b, mark, text, status="success"):
    """The turn after `mark` went on: its tool_result says `text`, and it ended."""
    b.wait(lambda: any(text in e["text"] for e in events_after(b, mark, "tool_result")), 30, f"a tool_result with {text!r}")
    return wait_result(b, mark, 30, status)


def press(b, key):
    ActionChains(b.driver).send_keys(key).perform()


def scenario_approvals(b, args):
    t = {}
    start = time.monotonic()
    b.open("/ui/sessions")
    b.click("new-session")
    b.set_value(b.tid("permission-mode"), "ask")
    b.click("create-session")
    b.wait(lambda: b.path().startswith("/ui/sessions/"), 15, "the new session's page")
    sid = b.path().rsplit("/", 1)[1]
    wait_connected(b)
    b.wait(lambda: b.text('[data-testid="permission-mode-shown"]') == ["ask"], 10, "the session's permission mode 'ask' beside the chat")

    # A click on Approve: the call runs and the turn ends.
    mark = max_seq(b)
    send_prompt(b, "$ echo clicked", via="enter")
    card = waiting(b, "echo clicked")
    if events_after(b, mark, "tool_result"):
        raise Failure("a tool_result came before the call was decided")
    b.shot("session-approval")
    b.click_css(f'[data-testid="approval"][data-call-id="{card["call_id"]}"] [data-testid="approval-allow"]')
    shown = decided(b, card["call_id"], "allowed", sent="allow")
    if "approved" not in shown["outcome"] or "by a person" not in shown["outcome"]:
        raise Failure(f"the approved card reads {shown['outcome']!r}")
    first = ran(b, mark, "ran: echo clicked")
    if not events_after(b, mark, "approval_requested") or not events_after(b, mark, "approval_decided"):
        raise Failure("the log's tool call does not show its approval events")
    t["click_s"] = round(time.monotonic() - start, 2)

    # The keyboard: the waiting call takes the focus, `y` approves it.
    mark = first["seq"]
    send_prompt(b, "$ echo keyed", via="enter")
    card = waiting(b, "echo keyed", focused=True)
    if card["ring"] in (None, "none"):
        raise Failure(f"the focused Approve button shows no focus ring: {card}")
    press(b, "y")
    decided(b, card["call_id"], "allowed", sent="allow")
    keyed = ran(b, mark, "ran: echo keyed")

    # Keys typed in the composer decide nothing; from the log, `n` denies.
    mark = keyed["seq"]
    send_prompt(b, "$ echo refused", via="enter")
    card = waiting(b, "echo refused", focused=True)
    box = b.tid("prompt")
    box.send_keys("no")
    b.wait(lambda: box.get_attribute("value") == "no", 5, "the composer to hold what was typed")
    if b.driver.execute_script(PENDING_JS) is None:
        raise Failure("typing in the composer decided the waiting call")
    b.set_value(box, "")
    b.driver.execute_script("document.querySelector('[data-testid=\"event-list\"]').focus()")
    press(b, "n")
    shown = decided(b, card["call_id"], "denied", sent="deny")
    refused = ran(b, mark, "not run")
    if "ran: echo refused" in " ".join(e["text"] for e in events_after(b, mark, "tool_result")):
        raise Failure("the denied call ran")

    # Another client decides: the card shows it without a click here.
    mark = refused["seq"]
    send_prompt(b, "$ echo elsewhere", via="enter")
    card = waiting(b, "echo elsewhere")
    status, body = b.api("POST", f"/agent/session/{sid}/approvals/{card['call_id']}",
                         {"decision": "deny", "message": "decided elsewhere"})
    if status != 200:
        raise Failure(f"deciding over the API answered {status}: {body}")
    shown = decided(b, card["call_id"], "denied")
    if "decided elsewhere" not in shown["outcome"]:
        raise Failure(f"the card decided elsewhere reads {shown['outcome']!r}")
    elsewhere = ran(b, mark, "decided elsewhere")

    # `a`: approved, and Bash allowed for the rest of the session.
    mark = elsewhere["seq"]
    send_prompt(b, "$ echo always", via="enter")
    card = waiting(b, "echo always", focused=True)
    press(b, "a")
    shown = decided(b, card["call_id"], "allowed", sent="allow")
    if "Bash is allowed for the rest of this session" not in shown["outcome"]:
        raise Failure(f"the card approved with 'a' reads {shown['outcome']!r}")
    always = ran(b, mark, "ran: echo always")
    mark = always["seq"]
    send_prompt(b, "$ echo remembered", via="enter")
    ran(b, mark, "ran: echo remembered")
    if events_after(b, mark, "approval_requested") or b.driver.execute_script(PENDING_JS):
        raise Failure("a call of the remembered tool waited for a decision")

    # No decision in time: the timeout denies it, and the card says so.
    status, body = b.api("POST", "/agent/session", {"session_name": "short wait", "options": {
        "permissions": {"mode": "ask", "approval_timeout_s": 1}}})
    if status not in (200, 201):
        raise Failure(f"creating the session with a 1 s timeout answered {status}: {body}")
    b.open(f"/ui/sessions/{body['session_id']}")
    wait_connected(b)
    mark = max_seq(b)
    send_prompt(b, "$ echo late", via="enter")
    # The call waits a second only: the wait is for its outcome, which
    # the card keeps, not for the moment it waited.
    call_id = b.wait(lambda: b.attr('[data-testid="approval"][data-state="denied"]', "data-call-id"), 30,
                     "the call of 'echo late' to be denied")
    shown = decided(b, call_id, "denied")
    if "by the timeout" not in shown["outcome"]:
        raise Failure(f"the card denied by the timeout reads {shown['outcome']!r}")
    ran(b, mark, "not run")

    return {"session_id": sid, "seconds_to_first": t["click_s"]}


def scenario_pipeline_approvals(b, args):
    """A node waiting for approval shows so; Allow on its call lets the run complete."""
    b.open("/ui/pipelines")
    select = b.tid("pipeline-select")
    b.wait(lambda: "gated" in [o.get_attribute("value") for o in select.find_elements("css selector", "option")], 15, "the gated pipeline")
    b.set_value(select, "gated")
    b.set_value(b.one('textarea[aria-label="Input state (JSON)"]'), '{"code": "$ echo gated"}')
    b.set_value(b.tid("permission-mode"), "ask")
    b.click("start-pipeline")
    b.wait(lambda: b.path().startswith("/ui/pipelines/pipeline-"), 15, "the run's page")
    node = '[data-testid="graph-node"][data-node="run"]'
    def classes():
        return (b.attr(node, "class") or "").split()
    b.wait(lambda: "waiting" in classes(), 20, "the node marked waiting")
    label = b.driver.execute_script("return document.querySelector(arguments[0]).textContent", f"{node} text.sub")
    shown = b.wait(lambda: b.driver.execute_script(
        "const el = document.querySelector('[data-testid=\"waiting-call\"][data-node=\"run\"]'); return el && el.textContent;"),
        10, "the node's waiting call")
    if "Bash" not in shown:
        raise Failure(f"the waiting call shows {shown!r}")
    b.shot("pipeline-approval")
    b.click_css('[data-testid="approve-call"]')
    b.wait(lambda: b.tid("run-status").get_attribute("data-status") == "completed", 30, "run-status completed")
    b.wait(lambda: "visited" in classes() and "waiting" not in classes(), 10, "the node visited, not waiting")
    if b.css('[data-testid="waiting-call"]'):
        raise Failure("the call still shows as waiting after the run completed")
    return {"label": label}
