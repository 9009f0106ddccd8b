"""The fork scenario (issue 38): a turn's Fork button makes a new session
from that turn's end, which opens, says where it came from, carries the
history and workspace of that turn and runs on, while its source stays as
it was. scenarios.py lists it; it is apart only to keep files short."""

from selenium.webdriver.common.keys import Keys

from scenarios import Failure, open_new_session, events_after, max_seq, send_prompt, wait_connected, wait_result

FIRST = "$ echo one > /workspace/mark.txt"
SECOND = "$ echo two >> /workspace/mark.txt"
THIRD = "$ cat /workspace/mark.txt"

# The forked line and what it carries, read in one script.
FORKED_JS = """
const line = document.querySelector('[data-type="forked"]');
if (!line) return null;
const link = line.querySelector('[data-testid="forked-source"]');
return {text: line.textContent, href: link ? link.getAttribute('href') : null,
        inherited: [...document.querySelectorAll('[data-testid="inherited-prompt"]')].map((el) => el.textContent)};
"""

# Each turn's prompt bubble and each Fork button, in page order.
PROMPTS_JS = "return [...document.querySelectorAll('.bubble-user')].filter((el) => !el.hidden).map((el) => el.textContent);"
FORKS_JS = """
return [...document.querySelectorAll('[data-testid="fork"]')].map((el) => ({
  seq: Number(el.dataset.atSeq), label: el.getAttribute('aria-label'), result: Number(el.closest('[data-type="result"]')?.dataset.seq)}));
"""


def users(status):
    return [m["content"] for m in status.get("history", []) if m.get("role") == "user"]


def status_of(b, sid):
    code, body = b.api("GET", f"/agent/session/{sid}/status")
    if code != 200:
        raise Failure(f"the status of {sid} answered {code}: {body}")
    return body


def turn(b, mark, prompt):
    send_prompt(b, prompt, via="enter")
    return wait_result(b, mark, 60, "success")


def scenario_fork(b, args):
    facts = {}
    source = open_new_session(b)

    first = turn(b, 0, FIRST)
    second = turn(b, first["seq"], SECOND)

    # One Fork button per finished turn, at its result's seq.
    forks = b.wait(lambda: (lambda f: f if len(f) == 2 else None)(b.driver.execute_script(FORKS_JS)), 10, "two Fork buttons")
    if [f["seq"] for f in forks] != [first["seq"], second["seq"]] or any(f["seq"] != f["result"] for f in forks):
        raise Failure(f"the Fork buttons are {forks}; the turns ended at {first['seq']} and {second['seq']}")
    if not all(f["label"] and f"seq {f['seq']}" in f["label"] for f in forks):
        raise Failure(f"the Fork buttons are not labelled with their turn end: {forks}")
    # The workspace kept at each turn end is listed beside the chat.
    b.wait(lambda: len(b.css('[data-testid="snapshot"]')) == 2, 20, "the two kept snapshots in the side panel")
    facts["snapshots"] = b.text('[data-testid="snapshot"]')
    before = status_of(b, source)
    b.shot("session-fork")

    b.click_css(f'[data-testid="fork"][data-at-seq="{first["seq"]}"]')
    b.wait(lambda: b.path().startswith("/ui/sessions/") and not b.path().endswith(source), 15, "the fork's page")
    fork = b.path().rsplit("/", 1)[1]
    wait_connected(b)

    # It says where it came from, and carries turn 1's prompt only.
    shown = b.wait(lambda: (lambda f: f if f and f["inherited"] else None)(b.driver.execute_script(FORKED_JS)), 15,
                   "the forked line with its inherited prompts")
    if "Forked from" not in shown["text"] or f"at seq {first['seq']}" not in shown["text"]:
        raise Failure(f"the forked line reads {shown['text']!r}")
    if shown["href"] != f"/ui/sessions/{source}":
        raise Failure(f"the forked line links to {shown['href']!r}, not the source {source}")
    if shown["inherited"] != [FIRST]:
        raise Failure(f"the fork shows the inherited prompts {shown['inherited']}")
    if b.css('[data-type="result"]'):
        raise Failure("a fresh fork shows turns of its own")
    made = status_of(b, fork)
    if users(made) != [FIRST] or "fork at" not in (made.get("session_name") or ""):
        raise Failure(f"the fork's status: name {made.get('session_name')!r}, prompts {users(made)}")
    b.shot("session-forked")

    # It runs on from turn 1's workspace: turn 2's line is not there.
    third = turn(b, max_seq(b), THIRD)
    out = " ".join(e["text"] for e in events_after(b, 0, "tool_result"))
    if "one" not in out or "two" in out:
        raise Failure(f"the fork's workspace reads {out!r}; expected turn 1's file only")
    if users(status_of(b, fork)) != [FIRST, THIRD]:
        raise Failure(f"the fork's history after its turn: {users(status_of(b, fork))}")
    # Reloaded, its own turn keeps its own prompt (not the inherited one).
    b.driver.refresh()
    wait_connected(b)
    b.wait(lambda: b.driver.execute_script(PROMPTS_JS) == [THIRD], 15, "the fork's one turn to show its own prompt")
    b.wait(lambda: (b.driver.execute_script(FORKED_JS) or {}).get("inherited") == [FIRST], 15, "the inherited prompt after a reload")

    # The source is as it was; its link opens it.
    after = status_of(b, source)
    if after["last_seq"] != before["last_seq"] or users(after) != [FIRST, SECOND]:
        raise Failure(f"the source changed: last_seq {before['last_seq']} → {after['last_seq']}, prompts {users(after)}")
    b.click_css('[data-testid="forked-source"]')
    b.wait(lambda: b.path() == f"/ui/sessions/{source}", 15, "the source's page")
    wait_connected(b)
    b.wait(lambda: len(b.css('[data-type="result"]')) == 2, 15, "the source's two turns")
    if b.css('[data-type="forked"]'):
        raise Failure("the source shows a forked line")

    # A refusal shows the server's message: the source is deleted by
    # another client, then its Fork button is pressed from the keyboard.
    code, body = b.api("DELETE", f"/agent/session/{source}")
    if code not in (200, 204):
        raise Failure(f"deleting the source answered {code}: {body}")
    code, refused = b.api("POST", f"/agent/session/{source}/fork", {"at_seq": second["seq"]})
    if code != 404:
        raise Failure(f"forking a deleted session answered {code}: {refused}")
    button = b.one(f'[data-testid="fork"][data-at-seq="{second["seq"]}"]')
    b.driver.execute_script("arguments[0].focus()", button)
    button.send_keys(Keys.ENTER)
    message = refused["error"]["message"]
    b.wait(lambda: any(message in t for t in b.text(".toast.danger")), 10, f"a toast with {message!r}")
    if b.path() != f"/ui/sessions/{source}":
        raise Failure(f"a refused fork navigated to {b.path()}")
    facts.update(source=source, fork=fork, at_seq=first["seq"], fork_result_seq=third["seq"], refusal=message)
    return facts

