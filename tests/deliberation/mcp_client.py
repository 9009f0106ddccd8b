"""An IDE's deliberation over MCP with the official Python SDK: calls the
`deliberate` tool with a progress callback and prints, as one JSON object,
the progress messages it got and the tool's result.

usage: mcp_client.py URL API_KEY
"""

import json
import sys

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main():
    url, key = sys.argv[1], sys.argv[2]
    progress = []

    async def on_progress(done, total, message):
        progress.append({"progress": done, "total": total, "message": message})

    timeout = httpx2.Timeout(30, read=300)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                tools = await session.list_tools()
                result = await session.call_tool(
                    "deliberate",
                    {"task_description": "Name a sorting algorithm", "role": "dev",
                     "num_agents": 3, "aggregate": "vote"},
                    progress_callback=on_progress,
                )
                structured = result.structured_content
                if structured is None:
                    structured = json.loads(result.content[0].text)
                try:
                    bad = await session.call_tool(
                        "deliberate", {"task_description": "x", "num_agents": 0})
                    bad_error = bad.is_error
                    bad_text = " ".join(getattr(c, "text", "") for c in bad.content)
                except Exception as e:  # the SDK raises JSON-RPC errors
                    bad_error, bad_text = True, str(e)
    print(json.dumps({
        "tools": sorted(t.name for t in tools.tools),
        "progress": progress,
        "result": structured,
        "is_error": result.is_error,
        "bad_is_error": bad_error,
        "bad_text": bad_text,
    }))


anyio.run(main)
