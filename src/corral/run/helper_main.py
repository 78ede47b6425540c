"""A run's helper process (child side), started by run/helpers.py inside the run cgroup.

    python -m corral.run.helper_main provider PARENT_PID SCENARIO TRANSCRIPT
    python -m corral.run.helper_main report PARENT_PID RUN_DIR
    python -m corral.run.helper_main forward PARENT_PID CONTROL_FD
    python -m corral.run.helper_main mcp PARENT_PID CONFIG_JSON

It has already joined `helpers-<name>` (the shell prelude did, before this
interpreter started). First it asks the kernel for SIGKILL when its parent
dies and checks the parent is still the one that started it
(PR_SET_PDEATHSIG does not fire for a parent already gone), so a coordinator
killed with -9 leaves no helper. Exit 125 when either fails.

`provider` prints `ready URL`, then answers each `tokens` line on stdin with
`tokens N` and stops at end of input. `report` writes the report and exits.
`forward` relays the product port (run/forward_relay.py); `mcp` serves the
MCP gateway (run/mcp_helper.py); both print `ready ...` and stop at end of input.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["main"]


def _guard(parent: int) -> bool:
    from corral.sandbox.namespace import set_pdeathsig

    try:
        set_pdeathsig(signal.SIGKILL)
    except OSError as exc:
        sys.stderr.write(f"corral helper: {exc}\n")
        return False
    return os.getppid() == parent


def _provider(scenario: str, transcript: str) -> int:
    from pathlib import Path

    from corral.provider.server import ProviderThread

    provider = ProviderThread(scenario, transcript=Path(transcript))
    url = provider.start()
    out = sys.stdout
    out.write(f"ready {url}\n")
    out.flush()
    try:
        for line in sys.stdin:
            if line.strip() == "tokens":
                out.write(f"tokens {int(provider.tokens_served)}\n")
                out.flush()
    finally:
        provider.stop()
    return 0


def _report(run_dir: str) -> int:
    from pathlib import Path

    from corral.run.environments import RunLayout
    from corral.run.report_job import write_report

    write_report(RunLayout(Path(run_dir)))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[1].isdigit():
        sys.stderr.write("corral helper: usage: NAME PARENT_PID ARGS...\n")
        return 2
    name, parent, args = argv[0], int(argv[1]), argv[2:]
    if not _guard(parent):
        return 125
    match name, args:
        case "provider", [scenario, transcript]:
            return _provider(scenario, transcript)
        case "report", [run_dir]:
            return _report(run_dir)
        case "forward", [fd] if fd.isdigit():
            from corral.run.forward_relay import serve

            return serve(int(fd))
        case "mcp", [config]:
            from corral.run.mcp_helper import serve_gateway

            return serve_gateway(config)
        case _:
            sys.stderr.write(f"corral helper: unknown helper {name!r} or arguments\n")
            return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
