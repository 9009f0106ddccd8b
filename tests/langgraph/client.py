"""Drives Conclave's /langgraph routes with the official langgraph-sdk
client and prints what it saw as one JSON object (tests/langgraph.rs
checks it). Usage: client.py BASE_URL KEY_A KEY_B"""

import json
import sys

from langgraph_sdk import get_sync_client

base, key_a, key_b = sys.argv[1:4]
url = base + "/langgraph"
a = get_sync_client(url=url, api_key=key_a)
b = get_sync_client(url=url, api_key=key_b)
out = {}

# A turn of the demo model streams one chunk per word: this one runs for
# seconds, long enough for a second run to meet it.
SLOW = " ".join(["word"] * 80)


def msg(text):
    return {"messages": [{"role": "user", "content": text}]}


def status_of(call):
    """The HTTP status a call failed with, or 200."""
    try:
        result = call()
        if hasattr(result, "__next__"):
            list(result)
        return 200
    except Exception as e:  # the SDK raises typed errors with the status
        response = getattr(e, "response", None)
        return getattr(e, "status_code", None) or getattr(response, "status_code", repr(e))


def texts(values):
    return [m["content"] for m in values["messages"]]


out["assistants"] = [x["assistant_id"] for x in a.assistants.search()]
out["unknown_assistant"] = status_of(lambda: a.assistants.get("nope"))
# A pipeline definition of the server's is an assistant of its own.
triage = a.assistants.get("pipeline:triage")
out["triage"] = {"graph_id": triage["graph_id"], "description": triage["description"]}
made = a.threads.create(graph_id="pipeline:triage")
out["triage_thread"] = {"graph_id": made["metadata"]["graph_id"],
                        "values": a.threads.get_state(made["thread_id"])["values"]}
out["triage_search"] = [
    t["thread_id"] for t in a.threads.search(metadata={"graph_id": "pipeline:triage"})
] == [made["thread_id"]]
out["no_key"] = status_of(lambda: get_sync_client(url=url, api_key=None).threads.create())

thread = a.threads.create()
tid = thread["thread_id"]
out["thread_status"] = thread["status"]

out["modes"] = {}
for mode in ["values", "updates", "messages-tuple", "events", "custom"]:
    parts = a.runs.stream(tid, "agent", input=msg(f"hello {mode}"), stream_mode=mode)
    out["modes"][mode] = [[p.event, p.data] for p in parts]
chatty = a.threads.create(graph_id="chatty")["thread_id"]
parts = a.runs.stream(
    chatty, "chatty", input=msg("say it a word at a time"), stream_mode="messages-tuple"
)
out["deltas"] = [p.data for p in parts if p.event == "messages"]
out["bad_mode"] = status_of(
    lambda: a.runs.stream(tid, "agent", input=msg("x"), stream_mode="bogus")
)
out["unknown_run_assistant"] = status_of(lambda: a.runs.wait(tid, "nope", input=msg("x")))

out["wait"] = texts(a.runs.wait(tid, "agent", input=msg("wait please")))
out["stateless"] = texts(a.runs.wait(None, "agent", input=msg("no thread")))

# Multitask strategies, each against a slow background run.
first = a.runs.create(tid, "agent", input=msg(SLOW))
out["reject"] = status_of(
    lambda: a.runs.wait(tid, "agent", input=msg("rejected"), multitask_strategy="reject")
)
enqueued = a.runs.wait(tid, "agent", input=msg("enqueued"), multitask_strategy="enqueue")
out["enqueue"] = texts(enqueued)[-4:]
out["enqueue_first"] = a.runs.get(tid, first["run_id"])["status"]

second = a.runs.create(tid, "agent", input=msg(SLOW))
after = a.runs.wait(tid, "agent", input=msg("after interrupt"), multitask_strategy="interrupt")
out["interrupt"] = texts(after)[-2:]
out["interrupted_status"] = a.runs.get(tid, second["run_id"])["status"]

# rollback stops the running run and takes it out of the thread (a thread
# of its own, so that the main thread's history stays one per turn).
rb = a.threads.create()["thread_id"]
a.runs.wait(rb, "agent", input=msg("kept"))
a.runs.create(rb, "agent", input=msg("rolled " + SLOW))
rolled = a.runs.wait(rb, "agent", input=msg("instead"), multitask_strategy="rollback")
out["rollback"] = texts(rolled)
out["rollback_state"] = texts(a.threads.get_state(rb)["values"])
out["rollback_history"] = [texts(h["values"]) for h in a.threads.get_history(rb, limit=10)]
out["rollback_thread"] = rb

third = a.runs.create(tid, "agent", input=msg(SLOW))
a.runs.cancel(tid, third["run_id"], wait=True)
out["cancelled_status"] = a.runs.get(tid, third["run_id"])["status"]

joined = a.runs.create(tid, "agent", input=msg("joined"))
out["join"] = texts(a.runs.join(tid, joined["run_id"]))[-1]

state = a.threads.get_state(tid)
out["state_len"] = len(state["values"]["messages"])
history = a.threads.get_history(tid, limit=100)
out["history_lens"] = [len(h["values"]["messages"]) for h in history]
out["search_a"] = tid in [t["thread_id"] for t in a.threads.search(limit=100)]
out["search_b"] = tid in [t["thread_id"] for t in b.threads.search(limit=100)]
out["b_get"] = status_of(lambda: b.threads.get(tid))
out["b_state"] = status_of(lambda: b.threads.get_state(tid))
out["b_run"] = status_of(lambda: b.runs.wait(tid, "agent", input=msg("intrude")))
out["b_delete"] = status_of(lambda: b.threads.delete(tid))
out["b_copy"] = status_of(lambda: b.threads.copy(tid))

# A copy: a new thread with the conversation so far, which goes its own way.
copy = a.threads.copy(tid)
out["copy_differs"] = copy["thread_id"] != tid
out["copy_len"] = len(copy["values"]["messages"])
a.runs.wait(copy["thread_id"], "agent", input=msg("only in the copy"))
out["copy_after"] = len(a.threads.get_state(copy["thread_id"])["values"]["messages"])
out["source_after"] = len(a.threads.get_state(tid)["values"]["messages"])

# Metadata: set at creation, merged by update, searched by, kept by a
# copy; another key can neither change nor find it.
labelled = a.threads.create(metadata={"project": "alpha", "n": 1})
lid = labelled["thread_id"]
out["labelled"] = lid
out["metadata_made"] = labelled["metadata"]
out["metadata_updated"] = a.threads.update(lid, metadata={"n": 2, "owner": "me"})["metadata"]
out["metadata_get"] = a.threads.get(lid)["metadata"]
out["metadata_search"] = [
    t["thread_id"] == lid for t in a.threads.search(metadata={"project": "alpha", "n": 2})
]
out["metadata_search_stale"] = len(a.threads.search(metadata={"project": "alpha", "n": 1}))
out["b_update"] = status_of(lambda: b.threads.update(lid, metadata={"n": 3}))
out["b_search"] = len(b.threads.search(metadata={"project": "alpha"}))
out["metadata_after_b"] = a.threads.get(lid)["metadata"]["n"]
out["metadata_copy"] = a.threads.copy(lid)["metadata"]

# A pipeline assistant: its thread's state is the run's state, its
# history the run's checkpoints.
pipe = a.threads.create(graph_id="sync")
pid = pipe["thread_id"]
final = a.runs.wait(pid, "sync", input=msg("Sync a sheet into the warehouse"))
pstate = a.threads.get_state(pid)
phistory = a.threads.get_history(pid, limit=100)
out["pipeline"] = {
    "final_is_state": final == pstate["values"],
    "state_keys": sorted(pstate["values"].keys()),
    "history_nodes": [h["metadata"]["node"] for h in phistory],
    "newest_is_state": phistory[0]["values"] == pstate["values"],
}
out["wrong_kind"] = status_of(lambda: a.runs.wait(pid, "agent", input=msg("x")))

# The store, in each key's own KV namespace.
a.store.put_item(["users", "u1"], "prefs", {"theme": "dark"})
a.store.put_item(["users", "u2"], "prefs", {"theme": "light"})
out["store_get"] = a.store.get_item(["users", "u1"], "prefs")["value"]
found = a.store.search_items(["users"], filter={"theme": "dark"})["items"]
out["store_search"] = [[i["namespace"], i["key"]] for i in found]
out["store_namespaces"] = a.store.list_namespaces(prefix=["users"])["namespaces"]
out["store_b_get"] = status_of(lambda: b.store.get_item(["users", "u1"], "prefs"))
a.store.delete_item(["users", "u1"], "prefs")
out["store_deleted"] = status_of(lambda: a.store.get_item(["users", "u1"], "prefs"))

gone = a.threads.create()
a.threads.delete(gone["thread_id"])
out["deleted_get"] = status_of(lambda: a.threads.get(gone["thread_id"]))

print(json.dumps(out))
