"""A stdio MCP server that, as it starts, writes what it was given to the
file named by its one argument: its environment and whether it has a
controlling terminal. The attack tests read it."""

import json
import os
import sys

from mcp.server import MCPServer

try:
    os.close(os.open("/dev/tty", os.O_RDWR))
    terminal = True
except OSError:
    terminal = False

with open(sys.argv[1], "w") as out:
    json.dump({"env": dict(os.environ), "terminal": terminal}, out)

server = MCPServer("envy")


@server.tool()
def nothing() -> str:
    """Does nothing."""
    return ""


server.run("stdio")
