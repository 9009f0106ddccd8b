"""An IDE's run_agent turn whose tool call waits for approval
(`options.permissions.mode: ask`), with the official Python SDK. Prints
what it saw as one JSON object; tests/mcp/approvals.rs asserts on it.

usage: approve.py MODE MCP_URL BASE_URL API_KEY
  MODE elicit: the client answers the server's elicitation with allow (a
               decision over HTTP after the turn finds nothing pending).
  MODE http:   the client declares no elicitation; it reads the HTTP
               instructions from the progress lines and decides over HTTP.
  MODE race:   the client's elicitation callback first allows the call over
               HTTP, then answers deny: the HTTP decision is the one taken.
"""

import json
import re
import sys

import anyio
import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

PROMPT = "Run it.\n```python\nprint('approved', 6 * 7)\n```\n"
OPTIONS = {"permissions": {"mode": "ask"}}
INSTRUCTIONS = re.compile(r"POST (/agent/session/[0-9a-f-]+/approvals/[A-Za-z0-9_-]+) with")


def text_of(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


async def main():
    mode, mcp_url, base_url, key = sys.argv[1:5]
    seen = {"progress": [], "elicitations": [], "http": []}
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=300)
    )

    async def decide_over_http(path, body):
        response = await http.post(base_url + path, json=body)
        seen["http"].append({"status": response.status_code, "body": response.json()})

    async def on_elicit(context, params):
        seen["elicitations"].append(
            {"message": params.message, "schema": params.requested_schema}
        )
        if mode == "race":
            sid, call = re.search(r"call (\S+) of session ([0-9a-f-]+)", params.message).group(2, 1)
            # Shielded: the server withdraws this request once the HTTP
            # decision lands, which may cancel this callback.
            with anyio.CancelScope(shield=True):
                await decide_over_http(
                    f"/agent/session/{sid}/approvals/{call}",
                    {"decision": "allow", "message": "allowed over HTTP"},
                )
            return types.ElicitResult(action="accept", content={"decision": "deny"})
        return types.ElicitResult(
            action="accept", content={"decision": "allow", "message": "go ahead"}
        )

    waiting = anyio.Event()
    instructions = {}

    async def on_progress(value, total, message):
        seen["progress"].append(message)
        found = INSTRUCTIONS.search(message or "")
        if found and not waiting.is_set():
            instructions["path"] = found.group(1)
            waiting.set()

    callback = on_elicit if mode in ("elicit", "race") else None
    async with http, streamable_http_client(mcp_url, http_client=http) as streams:
        async with ClientSession(streams[0], streams[1], elicitation_callback=callback) as session:
            await session.initialize()

            async def call():
                result = await session.call_tool(
                    "run_agent",
                    {"prompt": PROMPT, "options": OPTIONS},
                    progress_callback=on_progress,
                )
                seen["result"] = {
                    "is_error": result.is_error,
                    "text": text_of(result),
                    "structured": result.structured_content,
                }

            async with anyio.create_task_group() as group:
                group.start_soon(call)
                if mode == "http":
                    with anyio.fail_after(120):
                        await waiting.wait()
                    await decide_over_http(instructions["path"], {"decision": "allow"})
            sid = seen["result"]["structured"]["session_id"]
            events = await session.read_resource(f"conclave://sessions/{sid}/events")
            lines = events.contents[0].text.splitlines()
            seen["approval_events"] = [
                e for e in map(json.loads, lines) if e["type"].startswith("approval_")
            ]
            if mode == "elicit":
                # Decided already: a decision over HTTP finds nothing pending.
                call = seen["approval_events"][0]["call_id"]
                await decide_over_http(
                    f"/agent/session/{sid}/approvals/{call}", {"decision": "deny"}
                )
    print(json.dumps(seen))


anyio.run(main)
