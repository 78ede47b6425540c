"""Start an MCP server's `corral exec` as a part of the run (host side).

    python -m corral.run.mcp_launch PARENT_PID RUN_ID[:EPOCH]|- -- CORRAL... exec ... -- SERVER...

The MCP gateway spawns its servers through the official SDK, which gives no
hook between fork and exec; this prelude is that hook. It asks the kernel
for SIGTERM when the gateway's thread dies (corral exec turns SIGTERM into a
full teardown of the server's sandbox), checks that the parent did not die
before that request was in place (PR_SET_PDEATHSIG does not fire for a
parent that is already gone), joins the run's cgroup (so a coordinator
SIGKILLed before the signal can act leaves nothing its recovery sweep
misses), then execs. Any failure refuses to start the server (exit 125).
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["main"]


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("corral mcp_launch: usage: PARENT_PID RUN_ID|- -- COMMAND...\n")
        return 2
    parent, run_id, command = int(argv[0]), argv[1], argv[3:]
    from corral.sandbox.namespace import set_pdeathsig

    try:
        set_pdeathsig(signal.SIGTERM)
    except OSError as exc:
        sys.stderr.write(f"corral mcp_launch: {exc}\n")
        return 125
    if os.getppid() != parent:
        return 125
    if run_id != "-":
        from corral.errors import CorralError
        from corral.run.runcg import RunCgroup, parse_cgroup_key

        try:
            cg = RunCgroup.detect(*parse_cgroup_key(run_id))
            if cg is None:
                raise CorralError("no cgroup hierarchy")
            cg.attach_helper(os.getpid())
        except (CorralError, OSError) as exc:
            sys.stderr.write(f"corral mcp_launch: cannot join the run's cgroup: {exc}\n")
            return 125
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"corral mcp_launch: cannot run {command[0]}: {exc}\n")
    return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
