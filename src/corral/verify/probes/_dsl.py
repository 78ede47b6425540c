"""Small helpers shared by the probe modules (pure)."""

from __future__ import annotations

import textwrap

__all__ = ["MCP_CLIENT", "MCP_ROUTE", "code"]


def code(text: str) -> str:
    """Normalise an indented probe snippet."""
    return textwrap.dedent(text).strip() + "\n"


#: corral.toml for probes that reach the suite's MCP gateway (on host loopback)
#: through the broker's `mcp` route.
MCP_ROUTE = '[routes.mcp]\nupstream = "http://127.0.0.1:{mcp_port}"\nallow_private = true\n'

#: Probe code defining mcp_call(tool, arguments) -> reply text: one stateless
#: streamable-HTTP JSON-RPC request to the demo server behind the gateway,
#: through the broker route when a proxy is configured, else straight to it.
MCP_CLIENT = code("""
def mcp_call(tool, arguments):
    if proxy():
        (host, port), path = broker_addr(), "/routes/mcp/demo/mcp"
    else:
        host, port, path = "127.0.0.1", P["mcp_port"], "/demo/mcp"
    extra = b"Content-Type: application/json\\r\\nAccept: application/json, text/event-stream\\r\\n"
    out = []
    for rid, method, params in (
        (1, "initialize", {"protocolVersion": "2025-03-26", "capabilities": {},
                           "clientInfo": {"name": "corral-verify", "version": "1"}}),
        (2, "tools/call", {"name": tool, "arguments": arguments}),
    ):
        body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                           "params": params}).encode()
        r, e = tcp(host, port, http_req(path, "%s:%d" % (host, port), extra, "POST", body),
                   timeout=15)
        out.append((r or b"").decode("utf-8", "replace") if r is not None else "ERR %s" % e)
    status = out[-1].split("\\r\\n", 1)[0]
    print("mcp %s: %s | %s" % (tool, status[:60], out[-1].rsplit("\\r\\n\\r\\n", 1)[-1][:300]))
    return out[-1]
""")
