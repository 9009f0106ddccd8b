"""An IDE hands tasks to a sandboxed agent over MCP with the official Python
SDK: `run_agent` with progress, a second turn in the same session, a turn
cancelled mid-way, the sessions as resources (listed, read, subscribed to),
and another key that must see none of it. Prints what it saw as one JSON
object; tests/mcp.rs asserts on it.

usage: agent.py http URL API_KEY OTHER_API_KEY
       agent.py stdio API_KEY OTHER_API_KEY COMMAND [ARG...]
         (COMMAND, e.g. `conclave mcp --server URL`, started once per key
         with the key in CONCLAVE_API_KEY)
"""

import json
import os
import sys
import warnings
from contextlib import asynccontextmanager

import anyio
import httpx2
import jsonschema
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

warnings.simplefilter("ignore")  # resources/subscribe is the 2025 protocol's

CODE_PROMPT = "Compute it.\n```python\nprint(6 * 7)\n```\n"
SLOW_PROMPT = "Wait.\n```python\nimport subprocess\nsubprocess.run(['sleep', '37'])\n```\n"
# Counts the `sleep 37` processes of the sandbox.
COUNT_SLEEPS = (
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
    " | grep -c '^sleep 37' || true"
)


def text_of(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


async def error_of(call):
    """The error a request reports, as text, whether raised or returned."""
    try:
        result = await call
    except Exception as e:  # the SDK raises JSON-RPC errors
        return str(e) or type(e).__name__
    if getattr(result, "is_error", False):
        return text_of(result)
    return None


class Notes:
    """The server's notifications and the calls' ends, in the order they came."""

    def __init__(self):
        self.timeline = []
        self.updated = []
        self.list_changed = 0

    async def handle(self, message):
        message = getattr(message, "root", message)
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(str(message.params.uri))
        elif isinstance(message, types.ResourceListChangedNotification):
            self.list_changed += 1

    def progress(self, label):
        async def on_progress(value, total, message):
            self.timeline.append([label, "progress", message])

        return on_progress


async def run_agent(session, notes, label, arguments):
    result = await session.call_tool(
        "run_agent", arguments, progress_callback=notes.progress(label)
    )
    notes.timeline.append([label, "result", None])
    return {
        "is_error": result.is_error,
        "text": text_of(result),
        "structured": result.structured_content,
    }


async def read(session, uri):
    result = await session.read_resource(uri)
    content = result.contents[0]
    return {"mime_type": content.mime_type, "text": content.text}


async def shell(session, session_id, command):
    result = await session.call_tool(
        "execute_shell", {"command": command, "session_id": session_id}
    )
    return result.structured_content["stdout"].strip()


async def owner_side(session, notes):
    seen = {}
    tools = await session.list_tools()
    seen["tools"] = sorted(t.name for t in tools.tools)
    templates = await session.list_resource_templates()
    seen["templates"] = sorted(t.uri_template for t in templates.resource_templates)
    # What the MCP Inspector would warn about: every schema must be valid
    # JSON Schema (Draft 2020-12), every listing valid as the SDK's types.
    problems = []
    for tool in tools.tools:
        for kind, schema in (("input", tool.input_schema), ("output", tool.output_schema)):
            try:
                jsonschema.Draft202012Validator.check_schema(schema or {"type": "object"})
            except jsonschema.SchemaError as e:
                problems.append(f"{tool.name} {kind}: {e.message}")
    for listing, model in ((tools, types.ListToolsResult), (templates, types.ListResourceTemplatesResult)):
        try:
            model.model_validate(listing.model_dump(by_alias=True, exclude_none=True))
        except Exception as e:
            problems.append(str(e))
    seen["schema_problems"] = problems

    first = await run_agent(session, notes, "first", {"prompt": CODE_PROMPT})
    seen["first"] = first
    sid = first["structured"]["session_id"]
    seen["list_changed_after_first"] = notes.list_changed

    forked = await session.call_tool("fork_session", {"session_id": sid, "count": 2})
    seen["forked"] = {"is_error": forked.is_error, "structured": forked.structured_content}

    status_uri = f"conclave://sessions/{sid}"
    events_uri = f"{status_uri}/events"
    # A file of the session's workspace, as a resource.
    await session.call_tool(
        "write_file", {"path": "notes/hello.md", "content": "# hi\n", "session_id": sid}
    )
    seen["file"] = await read(session, f"{status_uri}/files/notes/hello.md")
    seen["missing_file"] = await error_of(session.read_resource(f"{status_uri}/files/nope.txt"))
    await session.subscribe_resource(events_uri)
    seen["second"] = await run_agent(
        session, notes, "second", {"prompt": "and now say hello again", "session_id": sid}
    )
    await anyio.sleep(0.5)  # the last update may trail the result
    seen["updated"] = sorted(set(notes.updated))
    await session.unsubscribe_resource(events_uri)

    listed = await session.list_resources()
    seen["listed"] = sorted(str(r.uri) for r in listed.resources)
    seen["status"] = json.loads((await read(session, status_uri))["text"])
    events = await read(session, events_uri)
    seen["events_mime"] = events["mime_type"]
    seen["event_types"] = [json.loads(line)["type"] for line in events["text"].splitlines()]

    # A turn cancelled while its command runs: the turn ends interrupted
    # and the command dies with it.
    tool_started = anyio.Event()

    async def on_slow(value, total, message):
        notes.timeline.append(["slow", "progress", message])
        if "sleep" in (message or ""):
            tool_started.set()

    async def slow_call():
        await session.call_tool(
            "run_agent", {"prompt": SLOW_PROMPT, "session_id": sid}, progress_callback=on_slow
        )

    async with anyio.create_task_group() as group:
        group.start_soon(slow_call)
        with anyio.fail_after(60):
            await tool_started.wait()
            sleeps = "0"
            while sleeps == "0":
                await anyio.sleep(0.3)
                sleeps = await shell(session, sid, COUNT_SLEEPS)
        seen["sleeps_before_cancel"] = sleeps
        group.cancel_scope.cancel()
    with anyio.fail_after(60):
        while True:
            status = json.loads((await read(session, status_uri))["text"])
            if not status["running"] and status["status"] != "running":
                break
            await anyio.sleep(0.2)
    seen["after_cancel"] = status["status"]
    events = (await read(session, events_uri))["text"].splitlines()
    seen["last_event"] = json.loads(events[-1])
    seen["sleeps_after_cancel"] = await shell(session, sid, COUNT_SLEEPS)
    seen["timeline"] = notes.timeline
    return seen, sid


async def other_side(session, sid):
    """Another key: the owner's session is not there for it."""
    seen = {}
    uri = f"conclave://sessions/{sid}"
    seen["run_agent"] = await error_of(
        session.call_tool("run_agent", {"prompt": "hi", "session_id": sid})
    )
    seen["fork_session"] = await error_of(session.call_tool("fork_session", {"session_id": sid}))
    seen["read"] = await error_of(session.read_resource(uri))
    seen["read_events"] = await error_of(session.read_resource(f"{uri}/events"))
    seen["read_file"] = await error_of(session.read_resource(f"{uri}/files/notes/hello.md"))
    seen["subscribe"] = await error_of(session.subscribe_resource(uri))
    own = await session.call_tool("run_agent", {"prompt": "mine"})
    own_id = own.structured_content["session_id"]
    listed = await session.list_resources()
    seen["own_id"] = own_id
    seen["listed"] = sorted(str(r.uri) for r in listed.resources)
    return seen


@asynccontextmanager
async def connect(target, key):
    """The read and write streams of one MCP connection made with `key`."""
    if target[0] == "http":
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=300)
        )
        async with http, streamable_http_client(target[1], http_client=http) as streams:
            yield streams[0], streams[1]
    else:
        env = {**os.environ, "CONCLAVE_API_KEY": key}
        params = StdioServerParameters(command=target[1], args=list(target[2:]), env=env)
        async with stdio_client(params) as streams:
            yield streams[0], streams[1]


async def main():
    notes = Notes()
    if sys.argv[1] == "http":
        target, (key, other) = ("http", sys.argv[2]), sys.argv[3:5]
    else:
        (key, other), target = sys.argv[2:4], ("stdio", *sys.argv[4:])
    async with connect(target, key) as (read_stream, write_stream):
        async with ClientSession(read_stream, write_stream, message_handler=notes.handle) as session:
            await session.initialize()
            seen, sid = await owner_side(session, notes)
    async with connect(target, other) as (read_stream, write_stream):
        async with ClientSession(read_stream, write_stream) as session:
            await session.initialize()
            seen["other"] = await other_side(session, sid)
    print(json.dumps(seen))


anyio.run(main)
