"""A small stdio MCP server, made with the official SDK, that a session
names in `options.mcp_servers`."""

from mcp.server import MCPServer

server = MCPServer("shout")


@server.tool()
def shout(text: str) -> str:
    """Returns the text in capitals."""
    return text.upper()


server.run("stdio")
