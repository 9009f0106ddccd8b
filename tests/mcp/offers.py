"""Lists what a stdio MCP server offers (its tools, and its resources when
it has any) with the official Python SDK, and prints one JSON object;
tests/mcp_servers.rs asserts on it. The server gets this process's whole
environment (the SDK's default passes only a few variables, not
XDG_STATE_HOME) and working directory.

usage: offers.py COMMAND [ARG...]
"""

import json
import os
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main():
    params = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:], env=dict(os.environ))
    seen = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            seen["server"] = init.server_info.name
            tools = await session.list_tools()
            seen["tools"] = sorted(t.name for t in tools.tools)
            if init.capabilities.resources is not None:
                resources = await session.list_resources()
                seen["resources"] = sorted(str(r.uri) for r in resources.resources)
    print(json.dumps(seen))


anyio.run(main)
