"""`conclave mcp --server URL` (the stdio relay) to a client of MCP's
2026-07-28 revision, with the official Python SDK: the relay keeps one
session with the server, so the stdio process's scratch sandbox lasts
from call to call as under 2025-11-25. Prints what it saw as one JSON
object; tests/mcp/revisions.rs asserts on it.

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
        await relayed.call_tool("execute_shell", {"command": "echo relayed > /workspace/r.txt"})
        kept = await relayed.call_tool("execute_shell", {"command": "cat /workspace/r.txt"})
        seen["kept"] = kept.structured_content["stdout"]
        seen["templates"] = len((await relayed.list_resource_templates()).resource_templates)
    print(json.dumps(seen))


anyio.run(main)
