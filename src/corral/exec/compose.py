"""The shell around a sandbox backend for `corral exec`: start, wait, report, journal."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys

from corral.sandbox.backend_config import BackendConfig, load_backend
from corral.sandbox.spec import ExecResult, SandboxSpec

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from corral.broker.attach import EgressBroker
    from corral.broker.journal import Journal
    from corral.broker.kernel_denials import KernelDenialWatch
    from corral.sandbox.backend import Sandbox
    from corral.sandbox.nodns import NoEgressDns
    from corral.sandbox.terminal import PtyRelay

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


def _journal_nodns(
    journal: Journal | None, *, spec: SandboxSpec, run: str, nodns: NoEgressDns
) -> None:
    """Say why lookups failed (stderr) and journal each refused name (bounded)."""
    if not nodns.queries:
        return
    from corral.sandbox.nodns import hint

    message = hint(nodns.names, nodns.queries)
    sys.stderr.write(f"corral exec: {message}\n")
    for name in nodns.names:
        _journal_event(
            journal,
            spec=spec,
            run=run,
            event="dns_refused",
            decision="deny",
            reason=f"egress is off: lookup of {name[:253]} refused; allow it with --allow HOST",
            detail={"name": name[:253], "queries_total": nodns.queries},
        )


def _journal_protect(
    journal: Journal | None, *, spec: SandboxSpec, run: str, state: object
) -> None:
    """Journal what was protected and every `--unprotect` opt-out; warn on a cut-short scan."""
    if not isinstance(state, dict):
        return
    if state.get("truncated"):
        sys.stderr.write(
            "corral exec: warning: the workspace scan for nested repositories stopped at its"
            " limit; repositories below it are not protected\n"
        )
    unprotected = state.get("unprotected") or []
    reason = f"{state.get('protected', 0)} host-executed path(s) read-only"
    if unprotected:
        reason += f"; unprotected by request: {' '.join(map(str, unprotected))}"
    _journal_event(journal, spec=spec, run=run, event="protect", reason=reason, detail=state)


def _created_below(
    journal: Journal | None, *, spec: SandboxSpec, run: str, running: Sandbox | None
) -> tuple[str, ...]:
    """Warn about (and journal) listed names the command created where nothing
    existed to protect: a new repository or `.envrc` in a subdirectory."""
    if running is None or not spec.protect:
        return ()
    from corral.sandbox.protect import Placeholders

    # Placeholders are the namespace backend's (`sandbox/protect.py`).
    ph = getattr(running, "placeholders", None)
    if not isinstance(ph, Placeholders) or not ph.created_below:
        return ()
    from corral.sandbox.protect import show

    rel = tuple(show(os.path.relpath(p, spec.workspace)) for p in ph.created_below)
    more = f" (+{len(rel) - 5} more)" if len(rel) > 5 else ""
    sys.stderr.write(
        f"corral exec: warning: the command created {len(rel)} host-executed path(s) below the"
        f" workspace top: {' '.join(rel[:5])}{more}; inspect them before running git, direnv"
        " or an editor there\n"
    )
    _journal_event(
        journal,
        spec=spec,
        run=run,
        event="protect_created_below",
        reason=f"the command created {len(rel)} host-executed path(s) below the workspace top",
        detail={"paths": list(rel[:100])},
    )
    return rel[:100]


def _journal_outcome(
    journal: Journal | None, run: str, result: ExecResult, spec: SandboxSpec
) -> None:
    if journal is None:
        return
    from corral.broker.actions import Identity
    from corral.broker.journal import outcome_observations

    who = Identity(run=run, session=spec.session_id, env=spec.env_kind)
    for obs in outcome_observations(result, who, spec.limits):
        journal.append(obs)


def _exec_control(run_id: str | None, session: str | None, env: str) -> Path | None:
    """`corral exec --run ID`'s live-policy socket; an exec without --run has none."""
    if run_id is None:
        return None
    from corral.broker.control import exec_control_dir, socket_name
    from corral.errors import BrokerError

    try:
        return exec_control_dir(run_id) / socket_name(session, env)
    except BrokerError:
        # An id that cannot name a directory: the exec runs, without live policy.
        return None


def _rmdir_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _terminal_relay(stack: contextlib.ExitStack) -> PtyRelay | None:
    """A pty for the sandbox when corral's stdio has a terminal (closed by `stack`)."""
    ttys = tuple(os.isatty(fd) for fd in range(3))
    if not any(ttys):
        return None
    from corral.sandbox.terminal import PtyRelay, may_use_terminal, plan_stdio

    plan = plan_stdio((ttys[0], ttys[1], ttys[2]), foreground=not ttys[0] or may_use_terminal(0))
    assert plan is not None
    relay = PtyRelay.open(plan)
    stack.callback(relay.close)
    return relay


def _strip_setid(journal: Journal | None, run: str, spec: SandboxSpec) -> str:
    """Clear setuid/setgid bits in every writable tree; a message if one was not fully checked.

    Runs after the sandbox is dead (M13): the bits there would be live on the host.
    """
    from corral.sandbox.setid import strip_setid

    unchecked = ""
    trees = [spec.workspace, *(b.path for b in spec.binds if b.writable)]
    for tree in trees:
        rep = strip_setid(tree)  # a `--rw FILE` is checked as a single file
        if rep.stripped or not rep.complete:
            _journal_event(
                journal,
                spec=spec,
                run=run,
                event="setid_stripped",
                decision="deny",
                reason=f"{rep.stripped} setuid/setgid mode(s) cleared under {tree}"
                + ("" if rep.complete else f"; walk incomplete: {rep.problem}"),
                detail=rep.to_detail(),
            )
        if not rep.complete and not unchecked:
            unchecked = (
                f"cannot clear setuid/setgid bits under {tree} ({rep.problem}); "
                "do not run programs from it"
            )
    return unchecked


def execute(
    spec: SandboxSpec,
    *,
    backend: BackendConfig,
    journal: str | None,
    dry_run: bool,
    interrupted_exc: type[BaseException],
    pending_signal: Callable[[], int],
) -> tuple[dict[str, object], int] | None:
    """Run `spec` to completion; return (the --json summary, exit status).

    `interrupted_exc` is what the CLI's signal handlers raise; when it arrives
    the sandbox is killed and the status is 128 + the signal. `pending_signal`
    is the first signal that arrived (0: none): an exception raised from a
    signal handler can be lost (in a finaliser, or in code that catches
    everything), so a signal that came during start-up is honoured before the
    wait rather than only by its exception. With a journal
    (or egress, which always journals), process events are recorded too.
    """
    sandboxes = load_backend(backend)
    if dry_run:
        from corral.exec.cli import quote_argv

        lines = [quote_argv(sandboxes.preview(spec))]
        if backend.kind == "namespace":
            from corral.sandbox.namespace import preview_stage

            # Mounts made before bwrap starts: part of what the sandbox gets.
            lines += ["# staged: " + quote_argv(row) for row in preview_stage(spec)]
        sys.stdout.write("\n".join(lines) + "\n")
        if backend.kind == "gvisor":
            import json

            from corral.sandbox.gvisor.backend import GVisorBackend

            assert isinstance(sandboxes, GVisorBackend)
            sys.stdout.write(json.dumps(sandboxes.preview_config(spec), indent=1) + "\n")
        if spec.unprotect:
            sys.stderr.write(f"corral exec: unprotected: {' '.join(sorted(spec.unprotect))}\n")
        return None
    from corral.sandbox.reaper import become_subreaper

    become_subreaper()
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
            from corral.broker.attach import EgressBroker
            from corral.broker.tls_setup import apply_to_spec

            spec = apply_to_spec(spec, stack)
            assert journal_path is not None and spec.network.broker_config is not None
            egress = EgressBroker(
                spec.network.broker_config,
                journal_path,
                run=run,
                session=spec.session_id,
                env=spec.env_kind,
                control=_exec_control(spec.run_id, spec.session_id, spec.env_kind),
                resident=os.environ.get("CORRAL_BROKER", "resident") != "cold",
            )
            if egress.control is not None:
                # Runs after egress.stop (LIFO): the broker has removed its socket by then.
                stack.callback(_rmdir_quietly, egress.control.parent)
            stack.callback(egress.stop)
        # The microVM's output comes over QEMU's serial channel, which has no
        # terminal to hand out; the guest's stdin is /dev/null.
        relay = _terminal_relay(stack) if backend.kind != "microvm" else None
        observer = None
        if jw is not None:
            from corral.broker.unix_journal import unix_observer

            observer = unix_observer(jw, spec=spec, run=run)
        kdenials: KernelDenialWatch | None = None
        if jw is not None:
            from corral.broker.kernel_denials import open_watch

            kdenials = open_watch(stack, jw)
        nodns: NoEgressDns | None = None
        # The responder listens in the sandbox's own netns; gVisor and the
        # microVM have their own network stacks and no host-side loopback to use.
        if not spec.network.needs_broker and backend.kind == "namespace":
            from corral.sandbox.nodns import NoEgressDns
            from corral.sandbox.nodns import attach as nodns_attach

            nodns = NoEgressDns()
            stack.callback(nodns.stop)
        running: Sandbox | None = None
        try:
            if relay is not None:
                relay.start()
            running = sandboxes.start(
                spec,
                network=egress.attach if egress else nodns_attach(nodns) if nodns else None,
                stdio=relay.stdio if relay is not None else None,
                unix_observer=observer,
            )
            if relay is not None:
                relay.spawned()
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
            _journal_protect(jw, spec=spec, run=run, state=running.layers.get("protect"))
            if kdenials is not None:
                from corral.broker.actions import Identity

                kdenials.watch_running(
                    running, Identity(run=run, session=spec.session_id, env=spec.env_kind)
                )
            try:
                early = pending_signal()
                timeout = spec.limits.timeout_s
                result = running.interrupt(early) if early else running.wait(timeout)
            except interrupted_exc as exc:
                signum = int(getattr(exc, "signum", 15))
                result = running.interrupt(signum)
            if kdenials is not None:
                kdenials.unwatch_running(running)
        finally:
            if running is not None:
                with contextlib.suppress(Exception):
                    running.close()
        if egress is not None:
            egress.stop()
            result = dataclasses.replace(result, layers={**result.layers, "broker": True})
        if nodns is not None:
            nodns.stop()
            _journal_nodns(jw, spec=spec, run=run, nodns=nodns)
        unchecked = _strip_setid(jw, run, spec)
        created = _created_below(jw, spec=spec, run=run, running=running)
        _journal_outcome(jw, run, result, spec)
        if jw is not None:
            jw.flush()
        observations = None
        if journal_path is not None:
            from corral.broker.journal import decision_counts

            allowed, denied = decision_counts(journal_path, run)
            observations = {"allowed": allowed, "denied": denied}
    if unchecked:
        sys.stderr.write(f"corral exec: {unchecked}\n")
        return result.summary(observations) | {"exit": 125, "message": unchecked}, 125
    if result.message and result.reason == "refused":
        from corral.display import show

        # The message comes from the sandbox's init over the status pipe.
        sys.stderr.write(f"corral exec: {show(result.message, 1000)}\n")
    if result.reason == "timeout":
        # A backend's own bound (a microVM's boot limit) can end a run that
        # had no --timeout.
        after = "" if spec.limits.timeout_s is None else f" after {spec.limits.timeout_s:g}s"
        sys.stderr.write(f"corral exec: timed out{after}; sandbox killed\n")
    elif result.reason == "oom":
        sys.stderr.write("corral exec: killed by the memory limit\n")
    summary = result.summary(observations)
    layers = summary.get("layers")
    if created and isinstance(layers, dict) and isinstance(layers.get("protect"), dict):
        layers["protect"] = {**layers["protect"], "created_below_top": list(created)}
    return summary, result.exit
