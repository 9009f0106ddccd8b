"""An IDE starts a pipeline over MCP with the official Python SDK: calls
`start_pipeline` with a progress callback and prints, as one JSON object,
the progress messages and the tool's result.

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
        progress.append({"progress": done, "message": message})

    timeout = httpx2.Timeout(30, read=300)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                result = await session.call_tool(
                    "start_pipeline", {"connector_name": "jira"}, progress_callback=on_progress)
                structured = result.structured_content
                if structured is None:
                    structured = json.loads(result.content[0].text)
    print(json.dumps({"progress": progress, "result": structured, "is_error": result.is_error}))


anyio.run(main)
