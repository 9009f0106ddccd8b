"""Drives Conclave's AG-UI endpoint with the official `ag-ui-protocol` SDK.

Requests are built with the SDK's RunAgentInput model; every event the
server sends is parsed with the SDK's Event union and must carry no field
the model does not know (pydantic keeps unknown fields, so they are looked
for). Prints one JSON object: what each case saw. Usage:

    client.py CASE --url URL --key KEY [--other-key KEY2]

CASE is `core` (plain run, reconnect, approval interrupt and resume,
deliberation, pipeline, bad input, another key) or `tools` (a run whose
tool runs in a sandbox).
"""

import argparse
import json
import sys
import uuid

import urllib.error
import urllib.request
from pydantic import BaseModel, TypeAdapter

from ag_ui.core import (AssistantMessage, Event, FunctionCall, ResumeEntry, RunAgentInput, Tool,
                        ToolCall, ToolMessage, UserMessage)

EVENT = TypeAdapter(Event)


def extras(model, path="event"):
    """The unknown fields anywhere in a parsed model."""
    found = []
    if isinstance(model, BaseModel):
        for key in (model.model_extra or {}):
            found.append(f"{path}.{key}")
        for name in type(model).model_fields:
            found += extras(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, list):
        for i, item in enumerate(model):
            found += extras(item, f"{path}[{i}]")
    return found


class Response:
    def __init__(self, status, headers, body):
        self.status_code, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)


class Client:
    """HTTP with the standard library: the SDK brings no client of its own."""

    def __init__(self, url, key):
        self.url = url
        self.key = key

    def request(self, path, body=None, content=None, stream=False):
        data = content if content is not None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}", data=data, method="POST",
            headers={"authorization": f"Bearer {self.key}",
                     "content-type": "application/json", "accept": "text/event-stream"})
        try:
            response = urllib.request.urlopen(request, timeout=120)
        except urllib.error.HTTPError as error:
            return Response(error.code, error.headers, error.read())
        if stream:
            return response
        return Response(response.status, response.headers, response.read())

    def post(self, path, run_input=None, content=None):
        body = None if run_input is None else dump(run_input)
        return self.request(path, body, content)

    def run(self, agent, run_input):
        """The run's events, each validated; raises on an invalid one."""
        response = self.request(f"/ag-ui/{agent}", dump(run_input), stream=True)
        if isinstance(response, Response):
            raise RuntimeError(f"HTTP {response.status_code}: {response.body!r}")
        assert response.headers["content-type"].startswith("text/event-stream")
        events = []
        with response:
            for line in response:
                line = line.decode().rstrip("\n")
                if not line.startswith("data:"):
                    continue
                raw = json.loads(line[5:].strip())
                event = EVENT.validate_python(raw)
                unknown = extras(event)
                if unknown:
                    raise RuntimeError(f"unknown fields {unknown} in {raw}")
                events.append(event.model_dump(mode="json", by_alias=True, exclude_none=True))
        return events


def dump(run_input):
    return run_input.model_dump(mode="json", by_alias=True, exclude_none=True)


def run_input(thread, text=None, forwarded=None, resume=None, messages=None, tools=()):
    if messages is None:
        messages = [UserMessage(id=str(uuid.uuid4()), content=text)]
    return RunAgentInput(
        thread_id=thread, run_id=str(uuid.uuid4()), state={}, messages=messages,
        tools=list(tools), context=[], forwarded_props=forwarded, resume=resume)


def client_tool(client):
    """A tool the page runs: its call ends the run, the next answers it."""
    thread = str(uuid.uuid4())
    page = Tool(name="Bash", description="Runs a command on the page",
                parameters={"type": "object", "properties": {"command": {"type": "string"}},
                            "required": ["command"]})
    ask = UserMessage(id="u1", content="$ echo on-the-page")
    first = client.run("agent", run_input(thread, messages=[ask], tools=[page]))
    calls = [e for e in first if e["type"] == "TOOL_CALL_START"]
    call = calls[0]["toolCallId"] if calls else "none"
    args = "".join(e["delta"] for e in first if e["type"] == "TOOL_CALL_ARGS")
    answered = [ask, AssistantMessage(id="a1", tool_calls=[ToolCall(
        id=call, function=FunctionCall(name="Bash", arguments=args))]),
        ToolMessage(id="t1", tool_call_id=call, content="page says hi")]
    second = client.run("agent", run_input(thread, messages=answered, tools=[page]))
    return {"first": {"types": types(first), "args": args, "last": first[-1]},
            "second": {"types": types(second), "last": second[-1],
                       "text": "".join(e["delta"] for e in second
                                       if e["type"] == "TEXT_MESSAGE_CONTENT")}}


def types(events):
    return [e["type"] for e in events]


def apply(state, delta):
    """The `add` operations the server sends, applied as RFC 6902 says."""
    for op in delta:
        assert op["op"] == "add", op
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = state
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = op.get("value")
    return state


def final_state(events):
    state = None
    for e in events:
        if e["type"] == "STATE_SNAPSHOT":
            state = e["snapshot"]
        elif e["type"] == "STATE_DELTA":
            state = apply(state, e["delta"])
    return state


def core(args):
    client = Client(args.url, args.key)
    seen = {}
    thread = str(uuid.uuid4())
    first = client.run("agent", run_input(thread, "hello there", {"text_deltas": True}))
    seen["plain"] = {"types": types(first),
                     "text": "".join(e["delta"] for e in first
                                     if e["type"] == "TEXT_MESSAGE_CONTENT"),
                     "finished": first[-1]}
    again = client.run("agent", run_input(thread, "and again"))
    snapshot = [e for e in again if e["type"] == "MESSAGES_SNAPSHOT"]
    seen["reconnect"] = {"types": types(again),
                         "snapshot": snapshot[0]["messages"] if snapshot else None}

    approval = str(uuid.uuid4())
    asked = client.run("agent", run_input(approval, "$ echo approved",
                                          {"permissions": {"mode": "ask"}}))
    outcome = asked[-1].get("outcome", {})
    seen["interrupt"] = {"types": types(asked), "outcome": outcome}
    interrupt_id = outcome.get("interrupts", [{}])[0].get("id", "none")
    resumed = client.run("agent", run_input(approval, resume=[
        ResumeEntry(interrupt_id=interrupt_id, status="resolved",
                    payload={"decision": "allow"})], messages=[]))
    seen["resumed"] = {"types": types(resumed),
                       "results": [e["content"] for e in resumed
                                   if e["type"] == "TOOL_CALL_RESULT"],
                       "last": resumed[-1]}

    seen["client_tool"] = client_tool(client)

    panel = client.run("deliberation", run_input(
        str(uuid.uuid4()), "Pick a name for a cat", {"num_agents": 2, "rounds": 0}))
    seen["deliberation"] = {"types": types(panel), "state": final_state(panel)}
    # A pipeline definition is an agent of its own, `pipeline:NAME`.
    pipeline = client.run("pipeline:connector", run_input(
        str(uuid.uuid4()), "connect", {"connector_name": "stripe", "mock": {}}))
    seen["pipeline"] = {"types": types(pipeline), "state": final_state(pipeline),
                        "steps": [e["stepName"] for e in pipeline
                                  if e["type"] == "STEP_STARTED"]}

    not_user = client.run("agent", run_input(str(uuid.uuid4()), messages=[
        AssistantMessage(id="a1", content="I speak first")]))
    bad_option = client.run("agent", run_input(str(uuid.uuid4()), "hi",
                                               {"max_turns": "many"}))
    other_kind = client.run("pipeline", run_input(thread, "connect"))
    seen["bad_input"] = {"not_user": not_user, "bad_option": bad_option,
                         "other_kind": other_kind}

    seen["not_uuid"] = status_and_body(
        client.post("/ag-ui/agent", run_input("thread-1", "hi")))
    seen["not_json"] = status_and_body(client.post("/ag-ui/agent", content=b"{not json"))
    seen["unknown_agent"] = status_and_body(
        client.post("/ag-ui/nobody", run_input(str(uuid.uuid4()), "hi")))
    seen["oversized"] = status_and_body(client.post(
        "/ag-ui/agent", content=b'{"x": "' + b"a" * (3 << 20) + b'"}'))
    other = Client(args.url, args.other_key)
    seen["other_key"] = status_and_body(
        other.post("/ag-ui/agent", run_input(thread, "let me in")))
    seen["thread"] = thread
    return seen


def status_and_body(response):
    try:
        body = response.json()
    except ValueError:
        body = response.body.decode(errors="replace")
    return {"status": response.status_code, "body": body}


def tools(args):
    client = Client(args.url, args.key)
    events = client.run("agent", run_input(str(uuid.uuid4()), "$ echo from-the-$((40 + 2))"))
    return {"types": types(events),
            "calls": [e for e in events if e["type"].startswith("TOOL_CALL")],
            "last": events[-1]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["core", "tools"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--other-key")
    args = parser.parse_args()
    seen = core(args) if args.case == "core" else tools(args)
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    main()
