"""The rollback scenario: a thread a LangGraph client rolled back, in the
chat. The undone turn says so, the rewind has a line of its own, and each
prompt of the history stays with its own turn (the history no longer
holds the undone one's). scenarios.py lists it; it is apart only to keep
files short."""

from scenarios import Failure, wait_connected

# Streamed a word at a time, so the run is still going when the rollback
# comes.
SLOW = "slow " + " ".join(["word"] * 80)

TURNS_JS = """
return [...document.querySelectorAll('.blk-turn')].map((el) => ({
  undone: el.classList.contains('undone'), label: el.querySelector('.turn-label')?.textContent || ''}));
"""
PROMPTS_JS = "return [...document.querySelectorAll('.bubble-user')].filter((el) => !el.hidden).map((el) => el.textContent);"


def run(prompt, then="reject"):
    return {"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": prompt}]},
            "multitask_strategy": then}


def answered(b, path, body):
    code, answer = b.api("POST", path, body)
    if code != 200:
        raise Failure(f"POST {path} answered {code}: {answer}")
    return answer


def scenario_rollback(b, args):
    b.open("/ui/sessions")
    thread = answered(b, "/langgraph/threads", {})["thread_id"]
    runs = f"/langgraph/threads/{thread}/runs"
    answered(b, f"{runs}/wait", run("one"))
    answered(b, runs, run(SLOW))
    answered(b, f"{runs}/wait", run("three", "rollback"))

    b.open(f"/ui/sessions/{thread}")
    wait_connected(b)
    line = b.one('[data-type="rewound"]')
    if "Rewound" not in line.text or "undone" not in line.text:
        raise Failure(f"the rewind's line reads {line.text!r}")
    turns = b.wait(lambda: (lambda t: t if len(t) == 3 else None)(b.driver.execute_script(TURNS_JS)), 20,
                   "three turns")
    if [t["undone"] for t in turns] != [False, True, False] or "Undone" not in turns[1]["label"]:
        raise Failure(f"the turns are {turns}: the second should say it was undone")
    prompts = b.wait(lambda: (lambda p: p if p == ["one", "three"] else None)(b.driver.execute_script(PROMPTS_JS)),
                     20, "the prompts one and three on their own turns")
    b.shot("rollback")
    return {"thread": thread, "rewound": line.text, "prompts": prompts}
