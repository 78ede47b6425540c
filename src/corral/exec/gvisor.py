"""`corral exec --backend gvisor`: one SandboxSpec under runsc, reported like the default backend.

The shell around `GVisorBackend` (compose.execute is the namespace one):
journal, terminal relay, setuid stripping and the --json summary are the
same helpers, so both backends report the same way.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from corral.exec.compose import (
    _journal_event,
    _journal_outcome,
    _strip_setid,
    _terminal_relay,
)
from corral.sandbox.backend import GVisorConfig
from corral.sandbox.gvisor.backend import GVisorBackend, GVisorSandbox
from corral.sandbox.spec import SandboxSpec

__all__ = ["execute"]


def execute(
    spec: SandboxSpec,
    *,
    journal: str | None,
    dry_run: bool,
    interrupted_exc: type[BaseException],
) -> tuple[dict[str, object], int] | None:
    """Run `spec` under gVisor; (the --json summary, exit status), or None for a dry run."""
    backend = GVisorBackend(GVisorConfig())
    if dry_run:
        import json

        from corral.exec.cli import quote_argv

        sys.stdout.write(quote_argv(backend.preview(spec)) + "\n")
        sys.stdout.write(json.dumps(backend.preview_config(spec), indent=1) + "\n")
        return None
    from corral.sandbox.reaper import become_subreaper

    become_subreaper()
    run = spec.run_id or f"exec-{os.urandom(4).hex()}"
    with contextlib.ExitStack() as stack:
        jw = None
        if journal is not None:
            from corral.broker.journal import Journal

            jw = stack.enter_context(Journal(Path(journal).resolve()))
        egress = None
        if spec.network.needs_broker:
            import tempfile

            from corral.broker.journal import Journal

            if jw is None:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="corral-exec-"))
                journal = os.path.join(tmp, "j.sqlite")
                jw = stack.enter_context(Journal(Path(journal)))
            from corral.broker.attach import EgressBroker

            assert journal is not None and spec.network.broker_config is not None
            egress = EgressBroker(
                spec.network.broker_config,
                Path(journal).resolve(),
                run=run,
                session=spec.session_id,
                env=spec.env_kind,
            )
            stack.callback(egress.stop)
        relay = _terminal_relay(stack)
        sandbox: GVisorSandbox | None = None
        try:
            if relay is not None:
                relay.start()
            sandbox = backend.start(
                spec,
                stdio=relay.stdio if relay is not None else None,
                network=egress.attach if egress is not None else None,
            )
            if relay is not None:
                relay.spawned()
            for layer, state in sandbox.layers.items():
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
                result = sandbox.wait(spec.limits.timeout_s)
            except interrupted_exc as exc:
                result = sandbox.interrupt(int(getattr(exc, "signum", 15)))
        finally:
            if sandbox is not None:
                with contextlib.suppress(Exception):
                    sandbox.close()
        if egress is not None:
            egress.stop()
        unchecked = _strip_setid(jw, run, spec)
        _journal_outcome(jw, run, result, spec)
        observations = None
        if jw is not None:
            jw.flush()
            if journal is not None:
                from corral.broker.journal import decision_counts

                allowed, denied = decision_counts(Path(journal).resolve(), run)
                observations = {"allowed": allowed, "denied": denied}
    if unchecked:
        sys.stderr.write(f"corral exec: {unchecked}\n")
        return result.summary(observations) | {"exit": 125, "message": unchecked}, 125
    if result.reason == "timeout":
        sys.stderr.write(
            f"corral exec: timed out after {spec.limits.timeout_s:g}s; sandbox killed\n"
        )
    elif result.reason == "oom":
        sys.stderr.write("corral exec: killed by the memory limit\n")
    return result.summary(observations), result.exit
