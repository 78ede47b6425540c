"""The shell around the namespace backend for `corral exec`: start, wait, report."""

from __future__ import annotations

import contextlib
import sys

from corral.sandbox.namespace import NamespaceSandbox, RunningSandbox, preview_argv
from corral.sandbox.spec import SandboxSpec

__all__ = ["execute"]


def execute(
    spec: SandboxSpec,
    *,
    journal: str | None,
    dry_run: bool,
    interrupted_exc: type[BaseException],
) -> tuple[dict[str, object], int] | None:
    """Run `spec` to completion; return (the --json summary, exit status).

    `interrupted_exc` is what the CLI's signal handlers raise; when it arrives
    the sandbox is killed and the status is 128 + the signal.
    """
    if dry_run:
        from corral.sandbox.exec_cli import quote_argv

        sys.stdout.write(quote_argv(preview_argv(spec)) + "\n")
        return None
    running: RunningSandbox | None = None
    try:
        running = NamespaceSandbox(spec).start()
        try:
            result = running.wait(spec.limits.timeout_s)
        except interrupted_exc as exc:
            signum = int(getattr(exc, "signum", 15))
            result = running.interrupt(signum)
    finally:
        if running is not None:
            with contextlib.suppress(Exception):
                running.close()
    if result.message and result.reason == "refused":
        sys.stderr.write(f"corral exec: {result.message}\n")
    if result.reason == "timeout":
        sys.stderr.write(
            f"corral exec: timed out after {spec.limits.timeout_s:g}s; sandbox killed\n"
        )
    elif result.reason == "oom":
        sys.stderr.write("corral exec: killed by the memory limit\n")
    summary = result.summary()
    return summary, result.exit
