"""Calls execute_shell on a session with another key and prints the error.

usage: intruder.py URL SESSION_ID API_KEY
"""

import sys

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main():
    url, session_id, key = sys.argv[1:4]
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30)) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                try:
                    result = await session.call_tool(
                        "execute_shell", {"command": "id", "session_id": session_id}
                    )
                    print("answered:", result)
                except Exception as e:
                    print("refused:", e)


anyio.run(main)
