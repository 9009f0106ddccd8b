"""Drives Conclave's MCP server with the official Python SDK and prints what
it saw as one JSON object; tests/mcp.rs asserts on it.

usage: client.py http URL SESSION_ID [API_KEY]
       client.py stdio SESSION_ID COMMAND [ARG...]
       client.py shell SESSION_ID SHELL_COMMAND COMMAND [ARG...]
         (one execute_shell call over stdio; prints its result)
"""

import base64
import io
import json
import sys
import tarfile
import uuid

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


def structured(result):
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


async def error_of(session, name, arguments):
    """The error a call reports, as text, whether raised or returned."""
    try:
        result = await session.call_tool(name, arguments)
    except Exception as e:  # the SDK raises JSON-RPC errors
        return str(e)
    if result.is_error:
        return " ".join(getattr(c, "text", "") for c in result.content)
    return None


async def exercise(read, write, session_id):
    seen = {}
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        seen["declares_prompts"] = init.capabilities.prompts is not None
        tools = await session.list_tools()
        seen["tools"] = sorted(t.name for t in tools.tools)
        seen["execute_code_schema"] = next(
            t.input_schema for t in tools.tools if t.name == "execute_code"
        )

        def formats(node):
            if isinstance(node, dict):
                found = [node["format"]] if "format" in node else []
                return found + [f for v in node.values() for f in formats(v)]
            if isinstance(node, list):
                return [f for v in node for f in formats(v)]
            return []

        # Standard JSON Schema only: no "uint64"/"int64" formats, which the
        # MCP Inspector refuses.
        seen["schema_formats"] = sorted(
            set(f for t in tools.tools for f in formats(t.input_schema) + formats(t.output_schema or {}))
        )

        result = await session.call_tool(
            "execute_code",
            {"code": "import os\nprint(6 * 7, os.getuid())", "session_id": session_id},
        )
        seen["execute_code"] = structured(result)

        # Plain Python unless the caller asks for repairs.
        seen["plain_cell"] = structured(await session.call_tool(
            "execute_code", {"code": "print('a').upper()", "session_id": session_id}
        ))
        seen["repaired_cell"] = structured(await session.call_tool(
            "execute_code",
            {"code": "print('a').upper()", "repair": True, "session_id": session_id},
        ))

        result = await session.call_tool(
            "write_file",
            {"path": "notes/a.txt", "content": "hello from mcp\n", "session_id": session_id},
        )
        result = await session.call_tool(
            "read_file", {"path": "/workspace/notes/a.txt", "session_id": session_id}
        )
        seen["read_file"] = structured(result)

        # A tar in and out through the tool call; a hostile one refused.
        def tar_of(entries, mode):
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode=mode) as tar:
                for name, data in entries:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            return base64.b64encode(buffer.getvalue()).decode()

        two = tar_of([("one.txt", b"one\n"), ("sub/two.txt", b"two\n")], "w:gz")
        seen["upload"] = structured(await session.call_tool(
            "upload", {"archive_base64": two, "path": "up", "session_id": session_id}
        ))
        got = structured(await session.call_tool(
            "download", {"path": "up", "session_id": session_id}
        ))
        packed = io.BytesIO(base64.b64decode(got["archive_base64"]))
        with tarfile.open(fileobj=packed, mode="r:gz") as tar:
            seen["download"] = sorted(
                [m.name, tar.extractfile(m).read().decode()] for m in tar.getmembers() if m.isfile()
            )
        seen["hostile_upload"] = await error_of(session, "upload", {
            "archive_base64": tar_of([("../escape.txt", b"x")], "w"), "session_id": session_id,
        })

        progress = []

        async def on_progress(value, total, message):
            progress.append(message)

        result = await session.call_tool(
            "execute_shell",
            {
                "command": "for i in 1 2 3 4; do echo tick $i; sleep 0.6; done",
                "session_id": session_id,
            },
            progress_callback=on_progress,
        )
        seen["execute_shell"] = structured(result)
        seen["progress"] = progress

        result = await session.call_tool(
            "execute_code", {"code": "echo 1", "timeout": 5, "language": "sh", "session_id": session_id}
        )
        seen["sh_language"] = structured(result)

        # 600 kB of output: sent once, it fits the SDK's 1 MiB event limit.
        result = await session.call_tool(
            "execute_shell",
            {"command": "head -c 600000 /dev/zero | tr '\\0' x", "session_id": session_id},
        )
        big = structured(result)
        seen["big_output"] = {
            "stdout_bytes": len(big["stdout"]),
            "truncated": big["truncated"],
            "text_bytes": sum(len(getattr(c, "text", "")) for c in result.content),
        }

        # A background run: listed while it runs, killed on request; a
        # plain call's leftovers die with it.
        started = structured(await session.call_tool(
            "execute_shell",
            {"command": "echo up; exec sleep 300", "background": True, "session_id": session_id},
        ))
        bid = started["background_id"]
        listed = None
        for _ in range(100):
            listed = structured(await session.call_tool("list_background", {"session_id": session_id}))
            if any("up" in r["stdout_tail"] for r in listed["runs"]):
                break
            await anyio.sleep(0.1)
        await session.call_tool(
            "execute_shell", {"command": "sleep 301 & echo left", "session_id": session_id}
        )
        alive = structured(await session.call_tool(
            "execute_shell", {"command": "ps -eo args | grep -c '[s]leep 30[01]' || true", "session_id": session_id},
        ))
        killed = structured(await session.call_tool("kill_background", {"id": bid, "session_id": session_id}))
        after = structured(await session.call_tool(
            "execute_shell", {"command": "ps -eo args | grep -c '[s]leep 30[01]' || true", "session_id": session_id},
        ))
        seen["background"] = {
            "started": started["status"],
            "listed": [(r["id"] == bid, r["status"], r["stdout_tail"]) for r in listed["runs"]],
            "alive_before_kill": alive["stdout"].strip(),
            "killed": killed["status"],
            "alive_after_kill": after["stdout"].strip(),
        }
        seen["unknown_background"] = await error_of(
            session, "kill_background", {"id": "bg-nope", "session_id": session_id}
        )

        seen["missing_argument"] = await error_of(session, "execute_code", {"session_id": session_id})
        seen["bad_type"] = await error_of(
            session, "execute_shell", {"command": 5, "session_id": session_id}
        )
        seen["unknown_session"] = await error_of(
            session, "execute_shell", {"command": "true", "session_id": str(uuid.uuid4())}
        )
        seen["not_a_uuid"] = await error_of(
            session, "execute_shell", {"command": "true", "session_id": "nope"}
        )
        seen["escape"] = await error_of(
            session, "read_file", {"path": "../etc/passwd", "session_id": session_id}
        )
        seen["bad_language"] = await error_of(
            session, "execute_code", {"code": "1", "language": "cobol", "session_id": session_id}
        )
        seen["unknown_tool"] = await error_of(session, "no_such_tool", {})
        # No prompts are declared, so prompts/list is an unknown method.
        try:
            await session.list_prompts()
            seen["list_prompts"] = "answered"
        except Exception as e:  # McpError carries the JSON-RPC error
            seen["list_prompts"] = getattr(getattr(e, "error", None), "code", str(e))
        # A tool's own failure is a result the model can read, not a
        # JSON-RPC error (which call_tool would raise).
        failures = []
        for name, arguments in [
            ("read_file", {"path": "../etc/passwd", "session_id": session_id}),
            ("edit_file", {"path": "notes/a.txt", "old_string": "absent", "new_string": "x",
                           "session_id": session_id}),
            ("execute_code", {"code": "1", "language": "cobol", "session_id": session_id}),
            ("execute_shell", {"command": "true", "session_id": str(uuid.uuid4())}),
        ]:
            result = await session.call_tool(name, arguments)
            failures.append([name, result.is_error, bool(result.content[0].text)])
        seen["failures_as_results"] = failures
    return seen


async def main():
    mode = sys.argv[1]
    if mode == "http":
        url, session_id = sys.argv[2], sys.argv[3]
        headers = {"Authorization": f"Bearer {sys.argv[4]}"} if len(sys.argv) > 4 else {}
        timeout = httpx2.Timeout(30, read=300)
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                seen = await exercise(streams[0], streams[1], session_id)
    elif mode == "stdio":
        session_id, command, args = sys.argv[2], sys.argv[3], sys.argv[4:]
        params = StdioServerParameters(command=command, args=args, env=None)
        async with stdio_client(params) as streams:
            seen = await exercise(streams[0], streams[1], session_id)
    elif mode == "shell":
        session_id, shell, command, args = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
        params = StdioServerParameters(command=command, args=args, env=None)
        async with stdio_client(params) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                result = await session.call_tool(
                    "execute_shell", {"command": shell, "session_id": session_id}
                )
                seen = {"is_error": result.is_error, "result": structured(result)
                        if not result.is_error else result.content[0].text}
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(seen))


anyio.run(main)
