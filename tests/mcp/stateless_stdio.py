"""`conclave mcp` over stdio to a client of MCP's 2026-07-28 revision,
with the official Python SDK: relaying (`--server URL`), it keeps one
session with the server, so the process's scratch sandbox lasts from call
to call as under 2025-11-25; serving the tools itself, it hands out
scratch handles as `/mcp` does, and the second call passes the first's.
Prints what it saw as one JSON object; tests/mcp/revisions.rs asserts on
it.

usage: stateless_stdio.py API_KEY CONCLAVE ARGS...
"""

import json
import os
import sys

import anyio
from mcp import StdioServerParameters
from mcp.client.client import Client


async def main():
    key, command, *args = sys.argv[1:]
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": os.environ.get("PATH", ""),
           "CONCLAVE_API_KEY": key}
    params = StdioServerParameters(command=command, args=args, env=env)
    seen = {}
    async with Client(params) as relayed:
        seen["version"] = relayed.protocol_version
        seen["tools"] = sorted(t.name for t in (await relayed.list_tools()).tools)
        wrote = await relayed.call_tool(
            "execute_shell", {"command": "echo relayed > /workspace/r.txt"}
        )
        handle = (wrote.meta or {}).get("dev.conclave/scratch_id")
        seen["handle"] = handle is not None
        again = {"session_id": handle} if handle else {}
        kept = await relayed.call_tool(
            "execute_shell", {"command": "cat /workspace/r.txt", **again}
        )
        seen["kept"] = kept.structured_content["stdout"]
        seen["templates"] = len((await relayed.list_resource_templates()).resource_templates)
    print(json.dumps(seen))


anyio.run(main)
