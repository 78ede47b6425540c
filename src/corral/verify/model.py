"""The vocabulary of `corral verify`: pure, frozen data and no I/O.

A `Probe` is one attempt made inside a sandbox (a small Python program), the
host-side preparation it needs (`steps`), the host-side facts to collect once
the sandbox is gone (`checks`) and the `oracle` that turns those facts into an
observation. The runner interprets steps and checks with an exhaustive
`match`; nothing in a probe definition touches the host by itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from corral.verify.oracles import Oracle

__all__ = [
    "CATEGORIES",
    "MANDATORY",
    "REQUIREMENTS",
    "USABILITY",
    "Category",
    "Check",
    "Evidence",
    "Expected",
    "Fault",
    "Hit",
    "JournalLacks",
    "Judgement",
    "MissionSpec",
    "Need",
    "Observed",
    "Probe",
    "ProbeLimits",
    "ProbeResult",
    "ReqStatus",
    "SetIdMode",
    "Skipped",
    "Step",
    "Verdict",
]

Category = Literal[
    "files",
    "network",
    "secrets",
    "processes",
    "host-integrity",
    "resources",
    "privilege",
    "audit",
    "usability",
]
CATEGORIES: tuple[Category, ...] = (
    "files",
    "network",
    "secrets",
    "processes",
    "host-integrity",
    "resources",
    "privilege",
    "audit",
    "usability",
)

Expected = Literal["allowed", "denied"]
Observed = Literal["allowed", "denied", "error"]
Verdict = Literal["ok", "unexpected", "broken-probe"]
ReqStatus = Literal["met", "failed", "not-applicable", "not-tested"]

#: docs/design.md section 1, in report order.
MANDATORY: dict[str, str] = {
    "M1": "files-read",
    "M2": "files-write",
    "M3": "network",
    "M4": "secrets",
    "M5": "processes",
    "M6": "host-integrity",
    "M7": "resources",
    "M8": "privilege",
    "M9": "audit",
    "M10": "fail-closed",
    "M11": "product-view",
    "M12": "verifier-integrity",
    "M13": "hostile-output",
    "M14": "terminal",
    "M15": "cross-sandbox",
}
USABILITY: dict[str, str] = {
    "U1": "workspace read/write/exec",
    "U2": "python, node, git, gcc, make",
    "U3": "provider reachable through the broker",
    "U4": "allowlisted registries",
    "U5": "MCP tools through the gateway",
    "U6": "processes up to the pids limit",
    "U7": "memory up to the limit",
    "U8": "loopback listen/connect inside",
    "U9": "product port reachable from verifier and viewer",
}
REQUIREMENTS: dict[str, str] = {**MANDATORY, **USABILITY}

#: What a probe needs from the host or the backend beyond running a command.
#: broker: egress through an allowlisting proxy (`--allow`); journal: `--journal FILE`;
#: pty: a terminal on stdin; victim: the shared host process holding secrets;
#: kill-victim: a fresh host process to be signalled; fd: an inherited secret fd;
#: netns: the canary network namespace; exec-json: `corral exec --json`;
#: hostgit: corral's host-side git helper; root: the suite runs as root;
#: faults: the fault injected removes a layer only corral has (peers: not applicable);
#: neighbour: a second sandbox of the same backend runs (and waits) alongside the probe,
#: inspected with it (`during="inspect"`, fact "neighbour_status").
#: corral-options: the attack goes through a `corral exec` option (a grant, the journal
#: path) that peers do not have (peers: not applicable).
Need = Literal[
    "broker",
    "journal",
    "pty",
    "victim",
    "kill-victim",
    "fd",
    "netns",
    "exec-json",
    "hostgit",
    "root",
    "kernel-audit",
    "faults",
    "neighbour",
    "corral-options",
]

#: Faults the runner injects around the backend's command line.
#: ro-cgroups: a private mount namespace in which every cgroup mount is read-only.
Fault = Literal["ro-cgroups"]


@dataclass(frozen=True, slots=True)
class ProbeLimits:
    """Limits passed to backends that have them (`corral exec` options)."""

    memory: str | None = None
    pids: int | None = None
    cpus: float | None = None
    timeout_s: float | None = None


# --- host-side preparation (interpreted by the runner) -----------------------
# Paths are `str.format_map` templates over the probe context (see runner.Ctx).


@dataclass(frozen=True, slots=True)
class Symlink:
    """Plant `link` (in the workspace) pointing at `target` before the run."""

    link: str
    target: str


@dataclass(frozen=True, slots=True)
class WriteFile:
    """Create `path` with `content` before the run (mode `mode`)."""

    path: str
    content: str
    mode: int = 0o644


@dataclass(frozen=True, slots=True)
class GitRepo:
    """Make `path` (default: the workspace) a git repository with one commit;
    with `git_dir`, its repository lives there (`git init --separate-git-dir`)."""

    path: str = "{ws}"
    git_dir: str | None = None


Step = Symlink | WriteFile | GitRepo


# --- host-side facts collected after teardown ---------------------------------


@dataclass(frozen=True, slots=True)
class PathExists:
    """Fact `key`: whether the host path exists (it is removed afterwards)."""

    key: str
    path: str


@dataclass(frozen=True, slots=True)
class FileChanged:
    """Fact `key`: whether an existing host file's content or mode changed
    (snapshotted before the run, restored afterwards)."""

    key: str
    path: str


@dataclass(frozen=True, slots=True)
class SameInode:
    """Fact `key`: whether host path `path` is the same inode as `target`."""

    key: str
    path: str
    target: str


@dataclass(frozen=True, slots=True)
class IsDevice:
    """Fact `key`: whether the host path is a block/char device node."""

    key: str
    path: str


@dataclass(frozen=True, slots=True)
class MountedAt:
    """Fact `key`: whether the host mount table has a mount at the path."""

    key: str
    path: str


@dataclass(frozen=True, slots=True)
class VictimKilled:
    """Fact `key`: whether the per-probe host victim process is gone."""

    key: str


@dataclass(frozen=True, slots=True)
class HostGit:
    """Fact `key`: whether running git on the host over the workspace made
    `{hits}/{marker}` appear (workspace content executed on the host).

    With `plain`, every backend gets what a user's own next `git commit` in
    `path` does (plain git), not corral's host-side helper."""

    key: str
    plain: bool = False
    path: str = "{ws}"


@dataclass(frozen=True, slots=True)
class TtyInjected:
    """Fact `key`: whether bytes with the marker were injected into the
    terminal the probe had on stdin."""

    key: str


@dataclass(frozen=True, slots=True)
class TtyChanged:
    """Fact `key`: what of the terminal the probe had on stdin (window size,
    termios, exclusive mode) differs after the run from before it; empty
    when nothing does."""

    key: str


@dataclass(frozen=True, slots=True)
class KernelLog:
    """Fact `key`: whether the host's kernel log (/dev/kmsg) holds the marker."""

    key: str


@dataclass(frozen=True, slots=True)
class JournalLacks:
    """Fact `key`: whether no row of the journal at `path` (a host journal
    other than the probe's own, e.g. the MCP gateway's) mentions every word
    of `words` (case-insensitive templates)."""

    key: str
    path: str
    words: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SetIdMode:
    """Fact `key`: whether the host path (not followed) is a regular file or
    directory carrying S_ISUID or S_ISGID (it is removed afterwards)."""

    key: str
    path: str


Check = (
    PathExists
    | FileChanged
    | SameInode
    | IsDevice
    | MountedAt
    | VictimKilled
    | HostGit
    | TtyInjected
    | TtyChanged
    | KernelLog
    | JournalLacks
    | SetIdMode
)


@dataclass(frozen=True, slots=True)
class MissionSpec:
    """A probe that is a whole `corral run` (mission kind; corral backends only).

    The runner writes a mission into a fresh directory: a fixed head (`agent =
    "script"`, the synthetic provider, `max_sessions`, short wall times,
    `checks_dir = "checks"`) followed by `front` (the `[product]` and
    `[[checks]]` tables), `checks_files` in its checks directory, and a
    scenario in which session 1's agent writes `files` into the workspace,
    then runs the probe's program there as `python3 -I -S .corral-probe.py
    MARKER` (its output is the probe's stdout), then says `say`. Every text
    is a template over the probe context, which adds `mission_dir`,
    `checks_dir`, `run_dir`, `run_checks`, `run_tools` and the host-only
    `proof` (never given to the program, the agent or the prompt). With
    `max_sessions` > 1 and `next_files`, session 2's agent writes those files
    (the checks must fail after session 1 for session 2 to run at all).
    With `host_views`, the runner also runs corral's host commands on the
    finished run and reads session 1's commit by bytes
    (`corral.verify.host_views.collect`).
    """

    front: str
    checks_files: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    say: str = "done"
    max_sessions: int = 1
    next_files: tuple[tuple[str, str], ...] = ()
    host_views: bool = False
    token_budget: int | None = None
    """The mission's run-wide `token_budget` (none by default)."""
    agent_error: str | None = None
    """Session 1's agent ends with this error text as its result (its last provider
    reply fails with this body; `{marker}` is the probe's marker)."""
    verifier_limits: str | None = None
    """The verifier's `[limits]` inline table (e.g. for Chromium in a browser check)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One attack (expected "denied") or one usability check (expected "allowed").

    `code` is Python run inside the sandbox after the shared prelude (which
    defines MARKER, P, result(), show(), read(), sysc(), ...). It must never
    contain a secret: secrets live only on the host. `baseline` says why the
    attack cannot succeed even on the bare host (`--backend none`); without
    it a denial there marks the probe as broken. `during` acts when the probe
    prints CORRAL-READY: kill or terminate the backend's launcher, or inspect
    the probe's processes from the host (fact "host_status"). `uses` names context keys
    (planted canaries) the probe cannot run without; `workspace`/`journal`
    override the workspace and journal paths given to the backend; with
    `refusal_ok` a backend refusing to start counts as a normal outcome (the
    refusal is the defence), otherwise a probe that never started is an
    error. `skip` says why the probe cannot be tested at all.
    `broker_config` is a corral.toml template (routes, rules) handed to
    corral backends as `--config FILE` (written outside the workspace);
    `exec_args` are extra `corral exec` options; `fault` is injected around
    the backend's command on every backend. `during="kill-broker"` SIGKILLs
    the broker process the journal names (`broker_start pid=N`) once the
    probe is ready. With `mission` the probe is a whole `corral run` instead
    (see `MissionSpec`); its oracle reads the run's state, report and journal.
    With `viewer` the host drives a browser at a hostile product instead.
    """

    id: str
    category: Category
    requirement: str
    description: str
    code: str
    oracle: Oracle
    expected: Expected = "denied"
    limits: ProbeLimits = field(default_factory=ProbeLimits)
    allow: tuple[str, ...] = ()
    needs: frozenset[Need] = frozenset()
    steps: tuple[Step, ...] = ()
    checks: tuple[Check, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    during: Literal["kill-backend", "term-backend", "inspect", "kill-broker"] | None = None
    serial: bool = False
    sample: bool = False
    grace_s: float = 0.0
    deadline_s: float = 20.0
    baseline: str | None = None
    skip: str | None = None
    uses: tuple[str, ...] = ()
    workspace: str | None = None
    journal: str | None = None
    refusal_ok: bool = False
    broker_config: str | None = None
    exec_args: tuple[str, ...] = ()
    fault: Fault | None = None
    mission: MissionSpec | None = None
    #: An M11 probe: the host drives a browser at a hostile product
    #: (`corral.verify.viewer_drive`); `code` is unused.
    viewer: bool = False


@dataclass(frozen=True, slots=True)
class Hit:
    """One contact logged by a host canary (server name, what, when)."""

    server: str
    marker: str
    detail: str
    time: float


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything the host observed about one probe run; oracles read only this."""

    stdout: str = ""
    stderr: str = ""
    exit: int | None = None
    wall_s: float = 0.0
    harness_timeout: bool = False
    backend_report: Mapping[str, Any] | None = None
    results: tuple[Mapping[str, Any], ...] = ()
    hits: tuple[Hit, ...] = ()
    survivors: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    max_procs: int = 0
    peak_rss: int = 0
    cpu_s: float = 0.0
    cgroup_peak: int | None = None
    journal: tuple[Mapping[str, Any], ...] | None = None
    secrets: Mapping[str, str] = field(default_factory=dict)
    ctx: Mapping[str, Any] = field(default_factory=dict)
    #: The backend's declared VMM overhead (MiB) by accelerator; empty: none
    #: (the sandbox's whole host footprint counts against its memory limit).
    vmm_overhead_mib: Mapping[str, int] = field(default_factory=dict)

    @property
    def result(self) -> Mapping[str, Any]:
        """The probe's last structured report (empty when it printed none)."""
        return self.results[-1] if self.results else {}

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr


@dataclass(frozen=True, slots=True)
class Judgement:
    observed: Observed
    why: str


@dataclass(frozen=True, slots=True)
class ProbeResult:
    probe: Probe
    observed: Observed
    verdict: Verdict
    evidence: str
    wall_s: float
    raw: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A probe that did not run, and why (`status` says whether it could not be
    tested here or does not apply to the backend at all)."""

    probe: Probe
    status: Literal["not-tested", "not-applicable"]
    reason: str
