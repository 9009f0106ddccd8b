"""The 2026-07-28 revision of MCP (no sessions: `server/discover`, the
protocol version and capabilities in each request's `_meta`) against
/mcp, with the official Python SDK, beside the 2025-11-25 handshake that
today's IDEs speak. Prints what it saw as one JSON object;
tests/mcp_revisions.rs asserts on it.

usage: stateless.py MCP_URL API_KEY OTHER_KEY ADMIN_KEY
"""

import json
import re
import sys

import anyio
import httpx2
from mcp import types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

SCRATCH_KEY = "dev.conclave/scratch_id"
PROMPT = "Run it.\n```python\nprint('approved', 6 * 7)\n```\n"
COUNT = "for i in 1 2 3 4; do echo line$i; sleep 0.6; done; echo kept > /workspace/kept.txt"


def client(url, key, **kwargs):
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=300)
    )
    return Client(streamable_http_client(url, http_client=http), **kwargs)


def shell(result):
    return {
        "is_error": result.is_error,
        "stdout": (result.structured_content or {}).get("stdout"),
        "handle": (result.meta or {}).get(SCRATCH_KEY),
        "texts": [getattr(c, "text", "") for c in result.content],
    }


async def forged_retry(url, key, session, call):
    """A raw 2026-07-28 retry of run_agent with a requestState naming
    `session` and an answer denying `call`; the result's text."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
    }
    body = {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": "run_agent", "arguments": {"prompt": "x"}, "_meta": meta,
            "requestState": f"conclave-approval:{session}:0",
            "inputResponses": {call: {"action": "accept", "content": {"decision": "deny"}}},
        },
    }
    headers = {
        "Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "run_agent",
    }
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.post(url, json=body, headers=headers)
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    message = json.loads(data[-1] if data else response.text)
    result = message["result"]
    return {"is_error": result.get("isError"), "text": result["content"][0]["text"]}


async def scratch_sandboxes(url, admin_key):
    """The ids of the server's scratch sandboxes, as an admin lists them."""
    base = url.rsplit("/mcp", 1)[0]
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.get(
            f"{base}/sandboxes?all=true", headers={"Authorization": f"Bearer {admin_key}"}
        )
    return sorted(s["id"] for s in response.json()["sandboxes"] if s["kind"] == "scratch")


async def settled(url, admin_key, expected):
    """The scratch sandboxes once they are `expected` again (the cancelled
    call's end is the server's), or after 60 s, what they are."""
    with anyio.move_on_after(60):
        while await scratch_sandboxes(url, admin_key) != expected:
            await anyio.sleep(0.2)
    return await scratch_sandboxes(url, admin_key)


async def main():
    url, key, other_key, admin_key = sys.argv[1:5]
    seen = {"progress": [], "elicitations": []}

    async def on_progress(value, total, message):
        seen["progress"].append(message)

    async def on_elicit(context, params):
        seen["elicitations"].append(params.message)
        # While the call waits, another key retries it with a state naming
        # the session and a deny: refused, and the call stays the owner's.
        sid, call = re.search(r"call (\S+) of session ([0-9a-f-]+)", params.message).group(2, 1)
        seen["forged_retry"] = await forged_retry(url, other_key, sid, call)
        return types.ElicitResult(
            action="accept", content={"decision": "allow", "message": "go ahead"}
        )

    async with client(url, key, elicitation_callback=on_elicit) as modern:
        seen["version"] = modern.protocol_version
        seen["server"] = modern.server_info.name
        # A call naming no session is handed a scratch sandbox, by id.
        first = await modern.call_tool(
            "execute_shell", {"command": COUNT}, progress_callback=on_progress
        )
        seen["first"] = shell(first)
        handle = seen["first"]["handle"]
        again = await modern.call_tool(
            "execute_shell", {"command": "cat /workspace/kept.txt", "session_id": handle}
        )
        seen["again"] = shell(again)
        fresh = await modern.call_tool(
            "execute_shell", {"command": "cat /workspace/kept.txt || echo none"}
        )
        seen["fresh"] = shell(fresh)
        # Another key cannot use the handle.
        async with client(url, other_key) as intruder:
            stolen = await intruder.call_tool(
                "execute_shell", {"command": "cat /workspace/kept.txt", "session_id": handle}
            )
            seen["stolen"] = shell(stolen)
        # A key holds at most 8: the ninth takes the place of the least
        # recently used (the first), whose sandbox goes with it.
        for _ in range(7):
            await modern.call_tool("list_files", {})
        evicted = await modern.call_tool(
            "execute_shell", {"command": "true", "session_id": handle}
        )
        seen["evicted"] = shell(evicted)
        # A call the client gives up on hands out nothing: its scratch
        # sandbox goes when the call ends.
        before = await scratch_sandboxes(url, admin_key)
        with anyio.move_on_after(3):
            await modern.call_tool("execute_shell", {"command": "sleep 60"})
        seen["scratch_before"] = before
        seen["scratch_after_cancel"] = await settled(url, admin_key, before)
        # An approval is an input_required result; the SDK answers it with
        # the elicitation callback and retries.
        ran = await modern.call_tool(
            "run_agent",
            {"prompt": PROMPT, "options": {"permissions": {"mode": "ask"}}},
            progress_callback=on_progress,
        )
        seen["run_agent"] = {"is_error": ran.is_error, "structured": ran.structured_content}
        session = ran.structured_content["session_id"]
        # Updates of the session's events on a subscriptions/listen stream
        # while its next turn runs.
        events_uri = f"conclave://sessions/{session}/events"
        # Another key listening for the same session is answered as any
        # listener is, and told nothing of it.
        async with client(url, other_key) as intruder, intruder.listen(
            resource_subscriptions=[events_uri]
        ) as spying, modern.listen(resource_subscriptions=[events_uri]) as subscription:
            seen["honored"] = list(subscription.honored.resource_subscriptions or [])
            seen["spy_honored"] = list(spying.honored.resource_subscriptions or [])
            seen["spied"] = []

            async def spy():
                async for event in spying:
                    seen["spied"].append(event.uri)

            turn_done = anyio.Event()

            async def second_turn():
                await modern.call_tool(
                    "run_agent", {"prompt": "say hello", "session_id": session}
                )
                turn_done.set()

            async with anyio.create_task_group() as group:
                group.start_soon(spy)
                group.start_soon(second_turn)
                with anyio.fail_after(60):
                    async for event in subscription:
                        seen["updated"] = event.uri
                        break
                with anyio.fail_after(120):
                    await turn_done.wait()
                # Every update of the turn has been sent: one for the other
                # key would have gone out with the owner's. A moment for it
                # to arrive, then the spy stops.
                await anyio.sleep(1)
                group.cancel_scope.cancel()

    # Today's IDEs: the handshake, and one scratch sandbox per connection.
    async with client(url, key, mode="legacy") as legacy:
        seen["legacy_version"] = legacy.protocol_version
        await legacy.call_tool("execute_shell", {"command": "echo mine > /workspace/l.txt"})
        kept = await legacy.call_tool("execute_shell", {"command": "cat /workspace/l.txt"})
        seen["legacy"] = shell(kept)
    print(json.dumps(seen))


anyio.run(main)
