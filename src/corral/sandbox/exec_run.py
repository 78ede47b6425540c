"""The shell around the namespace backend for `corral exec`: start, wait, report, journal."""

from __future__ import annotations

import contextlib
import os
import sys

from corral.sandbox.namespace import ExecResult, NamespaceSandbox, RunningSandbox, preview_argv
from corral.sandbox.spec import SandboxSpec
from corral.sandbox.unix_journal import unix_observer

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from corral.broker.journal import Journal
    from corral.sandbox.egress import EgressBroker

__all__ = ["execute"]


def _journal_event(
    journal: Journal | None,
    *,
    spec: SandboxSpec,
    run: str,
    event: str,
    reason: str,
    decision: str = "observe",
    detail: dict[str, object] | None = None,
) -> None:
    if journal is None:
        return
    from corral.broker.actions import Identity, Observation, ProcessEvent

    obs = Observation.of(
        ProcessEvent(event=event),
        Identity(run=run, session=spec.session_id, env=spec.env_kind),
        decision="deny" if decision == "deny" else "observe",
        rule=None,
        reason=reason,
        detail=detail or {},
    )
    journal.append(obs)


def _journal_outcome(
    journal: Journal | None, run: str, result: ExecResult, spec: SandboxSpec
) -> None:
    if journal is None:
        return
    lim = spec.limits
    if result.reason == "timeout":
        _journal_event(
            journal,
            spec=spec,
            run=run,
            event="timeout",
            decision="deny",
            reason=f"wall-clock limit {lim.timeout_s:g}s reached",
            detail={"timeout_s": lim.timeout_s},
        )
    if result.oom_kills:
        _journal_event(
            journal,
            spec=spec,
            run=run,
            event="oom_kill",
            decision="deny",
            reason=f"{result.oom_kills} process(es) killed by the memory limit",
            detail={"memory_bytes": lim.memory_bytes, "oom_kills": result.oom_kills},
        )
    if result.pids_limit_hits:
        _journal_event(
            journal,
            spec=spec,
            run=run,
            event="pids_limit",
            decision="deny",
            reason=f"fork refused {result.pids_limit_hits} time(s) at the pids limit",
            detail={"pids": lim.pids, "hits": result.pids_limit_hits},
        )
    if result.processes_killed_at_end:
        _journal_event(
            journal,
            spec=spec,
            run=run,
            event="killed_at_teardown",
            reason=f"{result.processes_killed_at_end} process(es) killed when the task ended",
            detail={"count": result.processes_killed_at_end},
        )
    _journal_event(
        journal,
        spec=spec,
        run=run,
        event="exit",
        reason=f"exit {result.exit} ({result.reason})",
        detail={
            "exit": result.exit,
            "reason": result.reason,
            "wall_s": round(result.wall_s, 4),
            "peak_memory_bytes": result.peak_memory_bytes,
        },
    )


def execute(
    spec: SandboxSpec,
    *,
    journal: str | None,
    dry_run: bool,
    interrupted_exc: type[BaseException],
) -> tuple[dict[str, object], int] | None:
    """Run `spec` to completion; return (the --json summary, exit status).

    `interrupted_exc` is what the CLI's signal handlers raise; when it arrives
    the sandbox is killed and the status is 128 + the signal. With a journal
    (or egress, which always journals), process events are recorded too.
    """
    if dry_run:
        from corral.sandbox.exec_cli import quote_argv

        sys.stdout.write(quote_argv(preview_argv(spec)) + "\n")
        return None
    run = spec.run_id or f"exec-{os.urandom(4).hex()}"
    with contextlib.ExitStack() as stack:
        journal_path: Path | None = None
        if journal is not None or spec.network.needs_broker:
            import tempfile
            from pathlib import Path

            if journal is not None:
                journal_path = Path(journal).resolve()
            else:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="corral-exec-"))
                journal_path = Path(tmp) / "j.sqlite"
        jw: Journal | None = None
        if journal_path is not None:
            from corral.broker.journal import Journal

            jw = stack.enter_context(Journal(journal_path))
        egress: EgressBroker | None = None
        if spec.network.needs_broker:
            from corral.sandbox.egress import EgressBroker

            assert journal_path is not None and spec.network.broker_config is not None
            egress = EgressBroker(
                spec.network.broker_config,
                journal_path,
                run=run,
                session=spec.session_id,
                env=spec.env_kind,
            )
            stack.callback(egress.stop)
        sandbox = NamespaceSandbox(
            spec,
            network_hook=egress.attach if egress else None,
            unix_observer=unix_observer(jw, spec=spec, run=run) if jw is not None else None,
        )
        running: RunningSandbox | None = None
        try:
            running = sandbox.start()
            if egress is not None:
                running.layers["broker"] = True
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
                signum = int(getattr(exc, "signum", 15))
                result = running.interrupt(signum)
        finally:
            if running is not None:
                with contextlib.suppress(Exception):
                    running.close()
        if egress is not None:
            egress.stop()
        _journal_outcome(jw, run, result, spec)
        if jw is not None:
            jw.flush()
        observations = None
        if journal_path is not None:
            from corral.broker.journal import decision_counts

            allowed, denied = decision_counts(journal_path, run)
            observations = {"allowed": allowed, "denied": denied}
    if result.message and result.reason == "refused":
        sys.stderr.write(f"corral exec: {result.message}\n")
    if result.reason == "timeout":
        sys.stderr.write(
            f"corral exec: timed out after {spec.limits.timeout_s:g}s; sandbox killed\n"
        )
    elif result.reason == "oom":
        sys.stderr.write("corral exec: killed by the memory limit\n")
    return result.summary(observations), result.exit
