"""The coordinator: creates runs and drives their session loop (the shell around the pure parts).

    layout = create_run(load_mission("examples/todo-api/MISSION.md"), Path(".corral/runs"))
    final = Coordinator(layout, progress).drive()     # "passed" | "exhausted" | "stopped" | ...

One session: the agent sandbox runs the agent CLI with a prompt built from the
mission, the previous sessions and the failed checks (its broker admits only
the provider route and the allowlist); when it ends (the agent finished, its
wall time, a stop, a broker crash) everything in it is killed and counted;
corral commits the workspace with `TrustedRepo` (never the workspace's git);
the product starts from a read-only snapshot of that commit; each check runs
in its own verifier sandbox against the snapshot and the product's forwarded
port; the product is killed. The run ends when every check passes, after
`max_sessions`, when the token budget is spent, or on `corral stop`.

Durability (store.py): each transition is committed before it takes effect;
`drive()` takes the run's flock first and starts with recovery - sessions left
`running` are marked interrupted, every process and cgroup left in the run's
cgroup subtree is killed and removed, and the workspace is reset to the last
commit. So `kill -9` at any point followed by `corral resume` continues the
run; a SIGTERM (`corral stop`) ends it as `stopped` after killing everything.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from corral._payload import path as payload_path
from corral.agents.base import AgentResult, Launch
from corral.agents.routes import check_compatible, route_secret_env
from corral.broker.actions import Identity, Observation, ProcessEvent
from corral.broker.config import BrokerConfig
from corral.broker.journal import decision_counts as journal_counts
from corral.broker.metering import journal_usage
from corral.broker.unix_journal import unix_observer
from corral.errors import (
    AgentError,
    ConfigError,
    CorralError,
    HelperError,
    LeaseLostError,
    UsageError,
)
from corral.hostgit import TrustedRepo
from corral.run.agent_port import RunAgent, resolve_agent
from corral.run.environments import (
    CHECK_REASON,
    RunLayout,
    agent_broker_config,
    agent_request,
    agent_spec,
    check_spec,
    check_wall_s,
    product_spec,
    provider_choice,
)
from corral.run.envnet import missing_secrets
from corral.run.forward import probe_ready
from corral.run.mission import Mission, ProviderRef, parse_mission, parse_provider
from corral.run.pause import active_clock, publish_pauses, wait_unpaused
from corral.run.product_io import ensure_data_dir, probe_all, strip_data_setid
from corral.run.progress import Progress
from corral.run.prompt import build_prompt
from corral.run.runcg import HELPER_GROUPS, RunCgroup
from corral.run.rundisk import create_run_disk
from corral.run.session import SessionHooks, SessionPlan, run_session
from corral.run.session import read_tail as _read_tail
from corral.run.store import CheckResult, RunLock, SessionRecord, Store
from corral.run.verdict import check_outcome, read_reason
from corral.sandbox.backend import Backend, Sandbox, SandboxNet, backend_config, load_backend
from corral.sandbox.reaper import become_subreaper
from corral.sandbox.setid import strip_setid

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from corral.broker.attach import EgressBroker
    from corral.broker.journal import Journal
    from corral.broker.kernel_denials import KernelDenialWatch
    from corral.run.forward_helper import HelperForwarder
    from corral.run.helpers import ProviderHelper
    from corral.run.store_api import RunStateStore
    from corral.run.watchdog import Watchdog
    from corral.sandbox.spec import ExecResult, Limits, SandboxSpec
    from corral.sandbox.unix_admit import UnixConnectEvent

__all__ = [
    "Coordinator",
    "RunConfig",
    "create_run",
    "journal_counts",
    "load_run",
    "new_run_id",
]

HTTP_CHECKER = Path(payload_path("http_check.py"))
CHECK_RUNNER = Path(payload_path("check_run.py"))
BROWSER_CHECKER = Path(payload_path("browser_check.py"))


def session_budget(session: int | None, run: int | None, run_spent: int) -> int | None:
    """What a session may spend: its own budget and what is left of the run's (pure)."""
    left = None if run is None else max(run - run_spent, 0)
    limits = [b for b in (session, left) if b is not None]
    return min(limits) if limits else None


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What `corral run` decided beyond the mission file (`run.json`)."""

    agent: str
    provider: str
    origin: str
    provider_key: str | None = None
    """Where a compatible provider's key is read (`env:NAME`, `file:/path`), never the key."""

    def to_json(self) -> str:
        d = {"agent": self.agent, "provider": self.provider, "origin": self.origin}
        if self.provider_key is not None:
            d["provider_key"] = self.provider_key
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        d = json.loads(text)
        key = d.get("provider_key")
        return cls(
            agent=str(d["agent"]),
            provider=str(d["provider"]),
            origin=str(d["origin"]),
            provider_key=None if key is None else str(key),
        )


def new_run_id(mission_name: str) -> str:
    """`<mission>-<yyyymmdd-hhmmss>-<hex>`; starts with a letter (see runcg.py)."""
    return f"{mission_name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def create_run(
    mission: Mission,
    runs_dir: Path,
    *,
    agent: str | None = None,
    provider: str | None = None,
    run_id: str | None = None,
) -> RunLayout:
    """Make the run directory: frozen copies of the mission, scenario and checks; state; repo."""
    agent_name = agent or mission.settings.agent
    run_agent = resolve_agent(agent_name)
    run_agent.install(runs_dir / ".probe-tools")
    shutil.rmtree(runs_dir / ".probe-tools", ignore_errors=True)
    try:
        ref = parse_provider(provider) if provider else mission.provider
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_compatible(provider_choice(ref), run_agent.name, run_agent.wire)
    # A missing key refuses the run before it exists (not a `failed` run later).
    route_secret_env(provider_choice(ref), os.environ)
    missing = missing_secrets(mission.settings.secrets, os.environ)
    if missing:
        raise UsageError(f"{mission.path}: {missing[0]}")
    rid = run_id or new_run_id(mission.name)
    layout = RunLayout(runs_dir.absolute() / rid)
    # 0700: a run's workspace, journal and reports are its user's alone.
    layout.root.mkdir(mode=0o700, parents=True, exist_ok=False)
    if mission.settings.limits.run_disk is not None:
        create_run_disk(runs_dir, rid, mission.settings.limits.run_disk)
    layout.mission.write_text(mission.text, encoding="utf-8")
    if ref.kind == "synthetic":
        assert ref.scenario is not None
        src = mission.resolve(ref.scenario)
        if not src.is_file():
            raise ConfigError(f"provider scenario {src} does not exist")
        shutil.copyfile(src, layout.root / "scenario.yaml")
        ref = ProviderRef("synthetic", str(layout.root / "scenario.yaml"))
    if mission.checks_dir is not None:
        shutil.copytree(mission.checks_dir, layout.checks, symlinks=True)
    for d in (layout.workspace, layout.transcripts, layout.tools):
        d.mkdir()
    layout.config.write_text(
        RunConfig(
            agent=agent_name, provider=str(ref), origin=str(mission.path), provider_key=ref.key
        ).to_json(),
        encoding="utf-8",
    )
    repo = TrustedRepo(layout.git_dir, layout.workspace)
    repo.init()
    base = repo.commit_all("corral: empty workspace")
    with Store(layout.state) as store:
        store.create_run(
            rid,
            mission=mission.name,
            agent=agent_name,
            provider=str(ref),
            max_sessions=mission.settings.max_sessions,
            memory_cap=mission.settings.limits.run_memory,
        )
        store.update_run(base_commit=base, last_commit=base)
    return layout


def load_run(layout: RunLayout) -> tuple[Mission, RunConfig]:
    """The frozen mission and config of a run directory."""
    if not layout.state.is_file():
        raise UsageError(f"{layout.root} is not a corral run (no state.sqlite)")
    cfg = RunConfig.from_json(layout.config.read_text(encoding="utf-8"))
    mission = parse_mission(layout.mission.read_text(encoding="utf-8"), cfg.origin)
    return mission, cfg


class _Stop(Exception):
    pass


class Coordinator:
    """Drives one run to its end. Use `drive()` once."""

    def __init__(
        self,
        layout: RunLayout,
        progress: Progress,
        backends: Mapping[str, Backend] | None = None,
        store: Callable[[], RunStateStore] | None = None,
        epoch: int | None = None,
    ) -> None:
        """`backends`: the backend of each environment (agent, product,
        verifier); default the mission's `backend` choice, loaded here so an
        unavailable one refuses the run before it starts. `store`: opens the
        run's state elsewhere than its SQLite file (a fleet's PostgreSQL, the
        caller holding the run's lease, which replaces the flock). `epoch`:
        that lease's fencing token; the run's cgroups are then this epoch's
        own (corral.run.runcg)."""
        self.layout = layout
        self.progress = progress
        self.mission, self.config = load_run(layout)
        if backends is None:
            kinds = self.mission.settings.backend
            backends = {
                env: load_backend(backend_config(getattr(kinds, env)))
                for env in ("agent", "product", "verifier")
            }
        self._backends = dict(backends)
        self._open_store = store
        self._epoch = epoch
        self._lease_lost = False
        self.provider_ref = parse_provider(self.config.provider, self.config.provider_key)
        self.run_id = layout.run_id
        self._stop_signal: int | None = None
        self._journal: Journal | None = None
        self._provider: ProviderHelper | None = None
        self._provider_url: str | None = None
        self._forwarder: HelperForwarder | None = None
        self._product_egress: EgressBroker | None = None
        self._kdenials: KernelDenialWatch | None = None
        self._cg: RunCgroup | None = None
        self._watchdog: Watchdog | None = None
        self._paused_s: Callable[[float, float], float] = lambda _since, _now: 0.0
        self._session = 0
        self._starts = 0
        self._agent: RunAgent | None = None
        self._agent_reported = 0
        self._started = time.monotonic()

    # -- signals ----------------------------------------------------------
    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _stopping(self) -> bool:
        return self._stop_signal is not None or self._helper_gone() is not None

    def _helper_gone(self) -> HelperError | None:
        gone = self._provider.dead() if self._provider is not None else None
        if gone is None and self._forwarder is not None:
            gone = self._forwarder.dead()
        return gone

    def _served(self) -> int:
        """Tokens the synthetic provider served so far (0 without one)."""
        if self._provider is None:
            return 0
        if self._stop_signal is not None and self._provider.dead() is not None:
            return self._provider.last_tokens  # killed by the stop
        try:
            return self._provider.tokens_served
        except HelperError:
            if self._stop_signal is None:
                raise
            # `corral stop` kills it while frozen: it exits only once thawed,
            # which can be after `dead()` looked.
            return self._provider.last_tokens

    def _check_helpers(self) -> None:
        """Raise (journaled) when a helper of the run died: the run cannot go on without it."""
        gone = self._helper_gone()
        # A stop kills every process of the run, helpers too: that is no failure.
        if gone is not None and self._stop_signal is None:
            self._journal_event("helper_died", str(gone)[:500], decision="deny")
            raise gone

    # -- journal ----------------------------------------------------------
    def _journal_event(
        self,
        event: str,
        reason: str,
        *,
        env: str = "agent",
        decision: str = "observe",
        detail: dict[str, Any] | None = None,
        session: int | None = None,
    ) -> None:
        if self._journal is None:
            return
        s = session if session is not None else self._session
        obs = Observation.of(
            ProcessEvent(event=event),
            Identity(run=self.run_id, session=str(s) if s else None, env=env),  # type: ignore[arg-type]
            decision="deny" if decision == "deny" else "observe",
            rule=None,
            reason=reason,
            detail=detail or {},
        )
        self._journal.append(obs)

    def _unix_observer(self, spec: SandboxSpec) -> Callable[[UnixConnectEvent], None] | None:
        if self._journal is None:
            return None
        return unix_observer(self._journal, spec=spec, run=self.run_id)

    def _on_forward(self, target: str) -> None:
        # Runs on the relay thread; an exception refuses the connection.
        assert self._journal is not None
        obs = Observation(
            run=self.run_id,
            session=str(self._session),
            env="verifier",
            kind="net_connect",
            target=target,
            decision="allow",
            rule="product-port",
            reason="verifier to the product's port through corral's forwarder",
        )
        self._journal.append(obs)

    # -- the loop ---------------------------------------------------------
    def drive(self) -> str:
        """Run sessions until the run ends; returns the final run state.

        Raises RunLockedError if another coordinator drives this run.
        """
        # A key that went missing since `corral run` is bad input for `resume`:
        # refused before the run is touched, so it is not marked failed.
        route_secret_env(provider_choice(self.provider_ref), os.environ)
        become_subreaper()
        lock = RunLock(self.layout.root)
        if self._open_store is None:
            lock.acquire(wait_s=3.0)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        store = Store(self.layout.state) if self._open_store is None else self._open_store()
        try:
            try:
                return self._drive(store)
            except LeaseLostError:
                # Another worker drives the run now, perhaps on this host: the
                # teardown sweeps only this epoch's cgroups, never the run's.
                self._lease_lost = True
                raise
            except Exception as exc:
                # State is durable: record why, so `status` shows it; `resume` may retry.
                with contextlib.suppress(Exception):
                    store.mark_interrupted()
                    why = str(exc) if isinstance(exc, CorralError) else repr(exc)
                    self._finish(store, "failed", f"corral error: {why}"[:500])
                if isinstance(exc, CorralError):
                    raise
                raise CorralError(f"the run failed: {exc!r}") from exc
        finally:
            self._teardown()
            store.close()
            for s, h in old.items():
                signal.signal(s, h)
            lock.release()

    def _drive(self, store: RunStateStore) -> str:
        from corral.broker.pgjournal import open_journal

        run = store.run()
        store.update_run(state="running", coordinator_pid=os.getpid(), stop_requested=0)
        store.event("coordinator_start", pid=os.getpid())
        self._journal = open_journal(self.layout.journal)
        self._paused_s = store.paused_s
        self._cg = RunCgroup.detect(self.run_id, self._epoch)
        if self._cg is None:
            raise CorralError("no cgroup hierarchy: a run needs its run-wide cgroup")
        self._recover(store, run.memory_cap)
        self._start_watchdog()
        self.progress.update(
            run=self.run_id, max_sessions=run.max_sessions, memory_cap=run.memory_cap
        )
        try:
            self._agent = resolve_agent(self.config.agent)
            self._agent.install(self.layout.tools)
        except AgentError as exc:
            return self._finish(store, "failed", str(exc))
        shutil.copyfile(HTTP_CHECKER, self.layout.tools / "http_check.py")
        if self.mission.settings.product is not None and self.mission.settings.product.data:
            ensure_data_dir(self.layout)
        shutil.copyfile(CHECK_RUNNER, self.layout.tools / "check_run.py")
        shutil.copyfile(BROWSER_CHECKER, self.layout.tools / "browser_check.py")
        if self.provider_ref.kind == "synthetic":
            from corral.run.helpers import ProviderHelper

            assert self.provider_ref.scenario is not None
            # In its own process in the run cgroup: what the agent posts is
            # read and parsed there, charged to the run, not to corral.
            self._provider = ProviderHelper(
                Path(self.provider_ref.scenario),
                self.layout.transcripts / "provider.jsonl",
                self._cg.helper_procs("provider"),
                self.layout.root / "helpers" / "provider.log",
                clock=self._clock(),
            )
            try:
                self._provider_url = self._provider.start()
            except HelperError as exc:
                self._journal_event("helper_failed", str(exc)[:500], decision="deny")
                raise
        else:
            # Each session's broker inherits corral's environment, where the
            # route's `env:NAME` credential is read (as in `corral agent run`).
            os.environ.update(route_secret_env(provider_choice(self.provider_ref), os.environ))
        if self.mission.settings.product is not None:
            self._forwarder = self._start_forwarder()
        budget = self.mission.settings.token_budget
        while True:
            self._check_helpers()
            if self._stopping():
                return self._finish(store, "stopped", "stopped by the user")
            sessions = store.sessions()
            done = [s for s in sessions if s.state == "done"]
            if len(done) >= self.mission.settings.max_sessions:
                return self._finish(
                    store, "exhausted", f"{len(done)} sessions without passing every check"
                )
            tokens = self._spent(sessions)
            if budget is not None and tokens >= budget:
                return self._finish(store, "exhausted", f"token budget spent ({tokens}/{budget})")
            n = (sessions[-1].n if sessions else 0) + 1
            # A paused run starts nothing new: a sandbox started now would
            # be frozen at birth and its start-up timeouts would fire.
            while store.paused() and not self._stopping():
                time.sleep(0.1)
            if self._stopping():
                return self._finish(store, "stopped", "stopped by the user")
            try:
                passed = self._session_loop(store, n)
            except _Stop:
                gone = self._helper_gone() if self._stop_signal is None else None
                store.end_session(
                    n,
                    state="interrupted",
                    end_reason="stopped by the user" if gone is None else str(gone)[:500],
                )
                self._check_helpers()
                return self._finish(store, "stopped", "stopped by the user")
            if passed:
                return self._finish(store, "passed", f"every check passed in session {n}")

    def _start_forwarder(self) -> HelperForwarder:
        from corral.run.forward_helper import HelperForwarder

        assert self._cg is not None
        # In its own process in the run cgroup: what the product sends a
        # verifier is buffered there, charged to the run, not to corral.
        try:
            return HelperForwarder(
                self._on_forward,
                self._cg.helper_procs("forward"),
                self.layout.root / "helpers" / "forward.log",
                clock=self._clock(),
            )
        except HelperError as exc:
            self._journal_event("helper_failed", str(exc)[:500], decision="deny")
            raise

    def _recover(self, store: RunStateStore, memory_cap: int) -> None:
        assert self._cg is not None
        interrupted = store.mark_interrupted()
        killed = self._cg.sweep() if self._cg.exists() else 0
        killed += self._cg.sweep_older_epochs()
        # Created before the workspace reset: its git is charged to the run.
        self._cg.create(memory_cap)
        for n in interrupted:
            self._journal_event(
                "session_interrupted",
                f"session {n} was interrupted (corral stopped or crashed)",
                session=n,
            )
        if killed:
            self._journal_event(
                "killed_at_recovery",
                f"{killed} leftover process(es) of the run killed at recovery",
                detail={"count": killed},
                session=0,
            )
        if interrupted or killed:
            store.event("recovered", interrupted=interrupted, killed=killed)
        run = store.run()
        if interrupted and run.last_commit:
            self._reset_workspace(run.last_commit)

    def _reset_workspace(self, commit: str) -> None:
        ws = self.layout.workspace
        token = secrets.token_hex(3)
        restored = ws.with_name(f"workspace.restore-{token}")
        # git runs with its cwd in the work tree: use the run directory for that.
        repo = TrustedRepo(
            self.layout.git_dir, self.layout.root, cgroup_procs=self._git_cg(), clock=self._clock()
        )
        _snapshot(repo, commit, restored)
        aside = ws.with_name(f"workspace.discarded-{token}")
        if ws.exists():
            ws.rename(aside)
        restored.rename(ws)
        shutil.rmtree(aside, ignore_errors=True)

    def _finish(self, store: RunStateStore, state: str, reason: str) -> str:
        run = store.run()
        peak = max(run.peak_memory, self._cg.peak_memory() if self._cg else 0)
        store.update_run(state=state, end_reason=reason, peak_memory=peak, coordinator_pid=None)
        store.event("run_end", state=state, reason=reason)
        self._write_report(store)
        if self._cg is not None and self._cg.exists():
            # The kernel's peaks of corral's own helpers, kept past the sweep.
            store.event(
                "helper_peaks", **{name: self._cg.helper_peak(name) for name in HELPER_GROUPS}
            )
        self.progress.update(state=state, activity=reason)
        return state

    def _write_report(self, store: RunStateStore) -> None:
        from corral.run.helpers import render_report_in_helper

        # Rendered in the run cgroup (matplotlib and the report's inputs are
        # charged to the run); a helper that cannot run leaves a report that
        # says so, in corral's own words, and a journal row.
        try:
            procs = self._cg.helper_procs("report") if self._cg and self._cg.exists() else ()
            render_report_in_helper(
                self.layout.root,
                procs,
                self.layout.root / "helpers" / "report.log",
                clock=self._clock(),
            )
        except CorralError as exc:
            self._journal_event("report_failed", str(exc)[:500], decision="deny")
            tmp = self.layout.report.with_suffix(".tmp")
            tmp.write_text(
                f"# Run {self.run_id}\n\nreport not rendered: {type(exc).__name__}\n",
                encoding="utf-8",
            )
            tmp.replace(self.layout.report)

    def _start_watchdog(self) -> None:
        from corral.run.watchdog import Watchdog, breach_handler

        assert self._cg is not None
        watch = self.mission.settings.watch

        def request_stop() -> None:
            self._stop_signal = signal.SIGTERM

        act = breach_handler(
            self.layout,
            self._cg,
            watch.on_breach,
            request_stop=request_stop,
            session=lambda: self._session,
        )
        self._watchdog = Watchdog(
            watch, self._cg, samples=self.layout.root / "footprint.jsonl", on_breach=act
        )
        self._watchdog.start()

    def _teardown(self) -> None:
        if self._watchdog is not None:
            self._watchdog.close()
        if self._forwarder is not None:
            self._forwarder.close()
        if self._provider is not None:
            with contextlib.suppress(Exception):
                self._provider.stop()
        # Without an epoch the run cgroup is the run's, which a successor may
        # use once the lease is lost; an epoch's subtree is only ever ours.
        if self._cg is not None and (self._epoch is not None or not self._lease_lost):
            with contextlib.suppress(CorralError, OSError):
                self._cg.sweep()
            if not self._lease_lost:
                self._cg.remove_parent()
        if self._journal is not None:
            self._journal.close()

    def _tick(self, store: Store | None = None) -> None:
        allowed, denied = journal_counts(self.layout.journal, self.run_id)
        self.progress.update(allowed=allowed, denied=denied)

    def _clock(self) -> Callable[[], float]:
        """The run's clock: it stops while the run is paused (`corral.pauseclock`)."""
        return active_clock(self._paused_s)

    def _git_cg(self) -> tuple[str, ...]:
        """Host git on the workspace runs in the run's `helpers` cgroup, charged to the run."""
        return self._cg.helper_procs() if self._cg is not None else ()

    def _strip_setid(self) -> None:
        # Each corral exec clears the bits at its own teardown; a SIGKILLed
        # one does not, so the host clears them again before it commits (M13).
        rep = strip_setid(str(self.layout.workspace))
        if rep.stripped or not rep.complete:
            self._journal_event(
                "setid_stripped",
                "setuid/setgid modes cleared",
                decision="deny",
                detail=rep.to_detail(),
            )
        if not rep.complete:
            raise CorralError(f"cannot clear setuid/setgid bits in the workspace: {rep.problem}")

    def _spent(self, sessions: list[SessionRecord]) -> int:
        """Tokens the run spent: per session, the recorded count or, for one
        interrupted before it was recorded, what its broker journaled."""
        total = 0
        for s in sessions:
            used, _ = journal_usage(self.layout.journal, self.run_id, str(s.n))
            total += max(s.tokens, used.total)
        return total

    # -- one session ------------------------------------------------------
    def _session_loop(self, store: RunStateStore, n: int) -> bool:
        self._session = n
        sessions = store.sessions()
        last_done = next((s for s in reversed(sessions) if s.state == "done"), None)
        last_checks = store.checks(last_done.n) if last_done else []
        prompt = build_prompt(self.mission, n, sessions, last_checks)
        store.begin_session(n, phase="agent")
        self.layout.session_dir(n).mkdir(parents=True, exist_ok=True)
        (self.layout.session_dir(n) / "prompt.md").write_text(prompt, encoding="utf-8")
        self.progress.update(session=n, phase="agent", activity="agent session running")
        self._agent_reported = 0
        served = self._served()
        end_reason, result, agent_result, broker_pid = self._agent_phase(store, n, prompt)
        self._check_helpers()
        if self._provider is not None:
            served = self._served() - served
        # The broker's count; with the synthetic provider also what it served
        # (both host-side; the larger wins). Never the agent's own report.
        tokens = max(agent_result.usage.total if agent_result else 0, served)
        summary = (agent_result.text or agent_result.error or "") if agent_result else ""
        store.update_session(
            n,
            phase="commit",
            agent_exit=result.exit if result else None,
            tokens=tokens,
            wall_s=result.wall_s if result else 0.0,
            agent_peak_memory=result.peak_memory_bytes if result else 0,
            processes_killed=result.processes_killed_at_end if result else 0,
            summary=summary[:2000],
            detail={
                "agent_end": end_reason,
                "broker_pid": broker_pid,
                "agent_reported_tokens": self._agent_reported,
                "provider_served_tokens": served if self._provider is not None else None,
            },
        )
        if self._stopping():
            raise _Stop
        self._tick()  # the agent's last calls, before the display moves on
        self.progress.update(phase="commit", activity="committing the workspace")
        self._strip_setid()
        repo = TrustedRepo(
            self.layout.git_dir,
            self.layout.workspace,
            cgroup_procs=self._git_cg(),
            clock=self._clock(),
        )
        sha = repo.commit_all(f"session {n}: {end_reason}")
        store.update_session(n, commit_sha=sha, phase="product")
        store.update_run(last_commit=sha)
        self.progress.update(phase="snapshot", activity=f"snapshot of {sha[:12]} for the checks")
        skipped = _snapshot(repo, sha, self.layout.snapshot(n))
        if skipped:
            store.event("snapshot_skipped", session=n, members=skipped[:50])
        results = self._verify(store, n)
        store.record_checks(n, results)
        peak = self._cg.peak_memory() if self._cg else 0
        run = store.run()
        store.update_run(peak_memory=max(run.peak_memory, peak))
        passed = bool(results) and all(r.passed for r in results)
        store.end_session(n, state="done", end_reason=end_reason, run_peak_memory=peak)
        self.progress.update(
            checks_passed=sum(r.passed for r in results),
            checks_total=len(results),
            run_peak=peak,
            activity=f"session {n}: {sum(r.passed for r in results)}/{len(results)} checks",
        )
        self.progress.line(
            f"session {n}: {end_reason}; "
            f"{sum(r.passed for r in results)}/{len(results)} checks passed; "
            f"run memory peak {peak / 2**20:.0f} MiB of the {run.memory_cap / 2**20:.0f} MiB cap"
        )
        return passed

    def _agent_phase(
        self, store: RunStateStore, n: int, prompt: str
    ) -> tuple[str, ExecResult | None, AgentResult | None, int | None]:
        assert self._agent is not None and self._cg is not None and self._journal is not None
        install = self._agent.install(self.layout.tools)
        request = agent_request(
            self._agent,
            self.mission,
            self.provider_ref,
            prompt=prompt,
            executable=install.executable,
            workspace=str(self.layout.workspace),
        )
        budget = session_budget(
            self.mission.settings.session.token_budget,
            self.mission.settings.token_budget,
            self._spent([s for s in store.sessions() if s.n != n]),
        )
        cg = self._cg

        def make_spec(launch: Launch, broker: BrokerConfig) -> SandboxSpec:
            return agent_spec(
                self.layout,
                mission=self.mission,
                n=n,
                launch=launch,
                broker_config=broker,
                ro_paths=install.ro_paths,
            )

        def on_broker(pid: int) -> None:
            with contextlib.suppress(CorralError, OSError):
                cg.attach_helper(pid)
            store.update_session(n, broker_pid=pid)

        plan = SessionPlan(
            agent=self._agent,
            request=request,
            # The broker is frozen with the run: its timers read the pauses too.
            broker=agent_broker_config(
                self.mission, self.provider_ref, self._provider_url, budget
            ).model_copy(update={"pauses": str(self.layout.pauses.absolute())}),
            make_spec=make_spec,
            identity=Identity(run=self.run_id, session=str(n), env="agent"),
            journal_path=self.layout.journal,
            stdout=self.layout.agent_stdout(n),
            stderr=self.layout.agent_stderr(n),
            mcp_dir=self.layout.mcp_dir(n),
            wall_s=self.mission.settings.session.wall_time,
            mcp=self.mission.mcp_policy() if self.mission.settings.mcp.servers else None,
            parent_cgroup=cg.relpath,
            backend=self._backends["agent"],
            run_cgroup=cg.key,
            # One resident per run, in the run's helpers cgroup (on_broker), so
            # its sessions skip a broker start while pause, the run's caps and
            # its teardown still cover the broker.
            resident_broker=os.environ.get("CORRAL_BROKER", "resident") != "cold",
            resident_socket=self.layout.root / "broker" / "resident.sock",
        )
        hooks = SessionHooks(
            should_stop=self._stopping,
            tick=self._tick,
            on_broker=on_broker,
            unix_observer=self._unix_observer,
            paused_s=store.paused_s,
        )
        outcome = run_session(plan, journal=self._journal, hooks=hooks)
        self._agent_reported = outcome.agent_reported_tokens
        return outcome.reason, outcome.exec, outcome.result, outcome.broker_pid

    def _journal_outcome(self, env: str, result: ExecResult, limits: Limits | None = None) -> None:
        if self._journal is None:
            return
        from corral.broker.journal import outcome_observations
        from corral.sandbox.spec import Limits

        s = self._session
        who = Identity(run=self.run_id, session=str(s) if s else None, env=env)  # type: ignore[arg-type]
        for obs in outcome_observations(result, who, limits or Limits()):
            self._journal.append(obs)

    # -- product and verifier ---------------------------------------------
    def _verify(self, store: RunStateStore, n: int) -> list[CheckResult]:
        """The product and the checks, their kernel denials journaled (env product/verifier)."""
        from corral.broker.kernel_denials import open_watch

        # The check runners read the pauses from this file: start them from
        # the durable record (a stop or crash while paused may have left an
        # open pause in it, which would stretch their own timeouts).
        with contextlib.suppress(OSError):
            publish_pauses(self.layout, store.pause_intervals)
        with contextlib.ExitStack() as stack:
            # Opened before the product starts, so that no early denial is missed.
            self._kdenials = open_watch(stack, self._journal)
            try:
                return self._verify_checks(store, n)
            finally:
                self._kdenials = None

    def _watch_kernel(self, running: Sandbox, env: str, n: int) -> None:
        if self._kdenials is not None:
            who = Identity(run=self.run_id, session=str(n) if n else None, env=env)  # type: ignore[arg-type]
            self._kdenials.watch_running(running, who)

    def _unwatch_kernel(self, running: Sandbox) -> None:
        if self._kdenials is not None:
            self._kdenials.unwatch_running(running)

    def _verify_checks(self, store: RunStateStore, n: int) -> list[CheckResult]:
        assert self._cg is not None
        product = self.mission.settings.product
        running: Sandbox | None = None
        ns: SandboxNet | None = None
        not_ready = ""
        try:
            if product is not None:
                self.progress.update(phase="product", activity="starting the product")
                running, ns, ready, why = self._start_product(n)
                store.update_session(n, product_ready=int(ready))
                self._journal_event(
                    "product_ready" if ready else "product_not_ready",
                    why,
                    env="product",
                    decision="observe" if ready else "deny",
                )
                if not ready:
                    not_ready = why
            if self._stopping():
                raise _Stop
            store.update_session(n, phase="verify")
            self._tick()
            self.progress.update(phase="verify", activity="running the checks")
            results = []
            for i, check in enumerate(self.mission.settings.checks):
                if self._stopping():
                    raise _Stop
                self.progress.update(activity=f"check {i + 1}/{len(self.mission.settings.checks)}")
                if check.restart_product and product is not None:
                    running, ns, not_ready = self._restart_product(store, n, running, check.name)
                if check.run is None and not_ready:
                    results.append(
                        CheckResult(check.name, False, f"product not ready: {not_ready}", None, 0.0)
                    )
                    continue
                results.append(self._run_check(n, i, ns))
            return results
        finally:
            self._stop_product(running)

    def _egress(self, spec: SandboxSpec, env: str) -> EgressBroker | None:
        """The broker of a product/verifier sandbox with egress (`corral.run.envnet`)."""
        if spec.network.broker_config is None:
            return None
        from corral.broker.attach import EgressBroker

        return EgressBroker(
            spec.network.broker_config,
            self.layout.journal,
            run=self.run_id,
            session=spec.session_id,
            env=env,
        )

    def _stop_product(self, running: Sandbox | None) -> None:
        if running is not None:
            result = running.interrupt(signal.SIGKILL)
            self._unwatch_kernel(running)
            running.close()
            self._journal_outcome("product", result)
        if self._product_egress is not None:
            self._product_egress.stop()
            self._product_egress = None
        rep = strip_data_setid(self.layout)
        if rep is not None and (rep.stripped or not rep.complete):
            self._journal_event(
                "setid_stripped",
                "setuid/setgid modes cleared in the product's data",
                env="product",
                decision="deny",
                detail=rep.to_detail(),
            )

    def _restart_product(
        self, store: RunStateStore, n: int, running: Sandbox | None, check: str
    ) -> tuple[Sandbox | None, SandboxNet | None, str]:
        """`restart_product` on a check: a fresh product (same snapshot, same data)."""
        self._stop_product(running)
        self._starts += 1
        self.progress.update(activity=f"restarting the product for {check!r}")
        new, ns, ready, why = self._start_product(n, self._starts)
        self._journal_event(
            "product_ready" if ready else "product_not_ready",
            f"restart {self._starts} before check {check!r}: {why}",
            env="product",
            decision="observe" if ready else "deny",
            detail={"start": self._starts, "check": check},
        )
        store.event("product_restart", session=n, start=self._starts, ready=ready)
        return new, ns, "" if ready else why

    def _start_product(
        self, n: int, start: int = 1
    ) -> tuple[Sandbox | None, SandboxNet | None, bool, str]:
        assert self._cg is not None
        product = self.mission.settings.product
        assert product is not None
        self._starts = start
        self.layout.product_dir(n, start).mkdir(parents=True, exist_ok=True)
        holder: list[SandboxNet] = []
        spec = product_spec(self.layout, self.mission, n, start)
        egress = self._product_egress = self._egress(spec, "product")

        def on_net(net: SandboxNet) -> None:
            if egress is not None:
                egress.attach(net)
            holder.append(net)

        try:
            running = self._backends["product"].start(
                spec,
                parent_cgroup=self._cg.relpath,
                network=on_net,
                unix_observer=self._unix_observer(spec),
            )
        except CorralError as exc:
            return None, None, False, f"the product sandbox could not start: {exc}"
        self._watch_kernel(running, "product", n)
        ns = holder[0]
        clock = active_clock(self._paused_s)
        ready, why = probe_all(
            ns,
            product,
            lambda: running.poll() is None and not self._stopping(),
            functools.partial(probe_ready, clock=clock),
            clock,
        )
        if not ready:
            err = _read_tail(self.layout.product_dir(n, start) / "stderr.log", 600).strip()
            if err:
                why += f"; product stderr: {err}"
        return running, ns, ready, why

    def _run_check(self, n: int, i: int, product_ns: SandboxNet | None) -> CheckResult:
        assert self._cg is not None
        check = self.mission.settings.checks[i]
        cdir = self.layout.check_dir(n, i)
        cdir.mkdir(parents=True, exist_ok=True)
        site = None
        if check.browser is not None:
            from corral.run.browser_site import playwright_site

            site = playwright_site()
            if site is None:
                # Fail closed: without Playwright the check cannot pass.
                why = "browser checks need Playwright for Python on the host (the browser extra)"
                return CheckResult(check.name, False, why, None, 0.0)
        spec = check_spec(
            self.layout,
            self.mission,
            n=n,
            i=i,
            check=check,
            http_checker=self.layout.tools / "http_check.py",
            playwright_site=site,
        )
        stops: list[Any] = []
        product = self.mission.settings.product
        fwd = self._forwarder

        egress = self._egress(spec, "verifier")
        if egress is not None:
            stops.append(egress.stop)

        def hook(net: SandboxNet) -> None:
            if egress is not None:
                egress.attach(net)
            if product is not None and product_ns is not None:
                assert fwd is not None
                for port in product.all_ports:
                    stops.append(fwd.expose(net.listen(port), product_ns, port))

        started = time.monotonic()
        try:
            running = self._backends["verifier"].start(
                spec,
                parent_cgroup=self._cg.relpath,
                network=hook if product_ns is not None or egress is not None else None,
                unix_observer=self._unix_observer(spec),
            )
        except CorralError as exc:
            for stop in stops:
                stop()
            return CheckResult(check.name, False, f"verifier refused: {exc}", None, 0.0)
        self._watch_kernel(running, "verifier", n)
        wall = check_wall_s(check)
        try:
            result = wait_unpaused(running, wall, self._paused_s)
        finally:
            self._unwatch_kernel(running)
            running.close()
            for stop in stops:
                stop()
        took = time.monotonic() - started
        self._journal_outcome("verifier", result, spec.limits)
        output = (
            _read_tail(cdir / "stdout.log", 3000) + _read_tail(cdir / "stderr.log", 1000)
        ).strip()
        passed, reason = check_outcome(result, check.timeout, read_reason(cdir / CHECK_REASON))
        return CheckResult(check.name, passed, reason, result.exit, took, output)


def _snapshot(repo: TrustedRepo, commit: str, dest: Path) -> list[str]:
    """`repo.snapshot`, also for a commit of an empty tree."""
    if repo.git("ls-tree", "--name-only", commit).strip():
        return repo.snapshot(commit, dest)
    # An empty tree's `git archive` is not a tar file tarfile accepts.
    dest.mkdir(parents=True)
    return []
