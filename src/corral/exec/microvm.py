"""`corral exec --backend microvm`: one VM, journaled like the namespace path.

The guest has no network device, so a spec that needs the broker is refused
(`check()` names the layer); stdin is /dev/null.
"""

from __future__ import annotations

import contextlib
import os
import sys

from corral.sandbox.backend import MicroVMConfig
from corral.sandbox.spec import SandboxSpec

__all__ = ["execute"]


def execute(
    spec: SandboxSpec,
    *,
    journal: str | None,
    dry_run: bool,
    interrupted_exc: type[BaseException],
) -> tuple[dict[str, object], int] | None:
    """Run `spec` in a microVM; return (the --json summary, exit status), None for a dry run."""
    from corral.sandbox.microvm.vm import MicroVMBackend

    backend = MicroVMBackend(MicroVMConfig())
    if dry_run:
        from corral.exec.cli import quote_argv

        sys.stdout.write(quote_argv(backend.preview(spec)) + "\n")
        return None
    from corral.exec.compose import (
        _created_below,
        _journal_event,
        _journal_outcome,
        _strip_setid,
    )

    run = spec.run_id or f"exec-{os.urandom(4).hex()}"
    with contextlib.ExitStack() as stack:
        jw = None
        if journal is not None:
            from pathlib import Path

            from corral.broker.journal import Journal

            jw = stack.enter_context(Journal(Path(journal).resolve()))
        running = backend.start(spec)
        try:
            for layer, state in running.layers.items():
                if isinstance(state, str) and state.startswith("degraded"):
                    _journal_event(
                        jw,
                        spec=spec,
                        run=run,
                        event="degraded",
                        reason=f"layer {layer} {state}",
                        detail={"layer": layer},
                    )
            try:
                result = running.wait(spec.limits.timeout_s)
            except interrupted_exc as exc:
                result = running.interrupt(int(getattr(exc, "signum", 15)))
        finally:
            with contextlib.suppress(Exception):
                running.close()
        # The second line behind QEMU's filter: bits that were already on disk.
        unchecked = _strip_setid(jw, run, spec)
        created = _created_below(jw, spec=spec, run=run, running=running)
        _journal_outcome(jw, run, result, spec)
        if jw is not None:
            jw.flush()
    if unchecked:
        sys.stderr.write(f"corral exec: {unchecked}\n")
        return result.summary() | {"exit": 125, "message": unchecked}, 125
    if result.message and result.reason == "refused":
        from corral.display import show

        # The message comes from the guest's init over its report port.
        sys.stderr.write(f"corral exec: {show(result.message, 1000)}\n")
    if result.reason == "timeout":
        sys.stderr.write(f"corral exec: timed out after {spec.limits.timeout_s:g}s; VM killed\n")
    elif result.reason == "oom":
        sys.stderr.write("corral exec: killed by the memory limit\n")
    summary = result.summary()
    layers = summary.get("layers")
    if created and isinstance(layers, dict) and isinstance(layers.get("protect"), dict):
        layers["protect"] = {**layers["protect"], "created_below_top": list(created)}
    return summary, result.exit
