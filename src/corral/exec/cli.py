"""`corral exec`: one command in a sandbox (docs/design.md section 5).

Parsed with argparse rather than typer: this path runs once per sandboxed
command and importing typer/rich would dominate its start-up time. The
common form (`--opt value`/`--opt=value`/flags, then `--`) is parsed without
argparse at all (`_fast_parse`); anything else goes to argparse.

Exit status: the command's own; 124 on timeout; 125 when corral refused or
failed to start the sandbox (one line on stderr); 137 when the memory limit
killed it; 2 for bad input; 127 when the command is not found inside.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from collections.abc import Sequence

from corral.errors import CorralError, LayerUnavailableError, SandboxStartError, UsageError
from corral.sandbox import interrupts
from corral.sandbox.spec import DEFAULT_PATH, LAYERS, Bind, Limits, NetworkSpec, SandboxSpec
from corral.sandbox.units import parse_cpus, parse_duration, parse_size

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from types import FrameType
    from typing import NoReturn

    from _typeshed import SupportsWrite

    from corral.sandbox.spec import EnvKind, SandboxSpec

__all__ = ["build_spec", "parse_args", "run_exec", "sandbox_env", "validate_path"]

EXIT_USAGE = 2
EXIT_REFUSED = 125

#: System trees a writable mount may not be, contain, or sit inside.
_SYSTEM_TREES = (
    "/usr",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/run",
)


def _parser() -> argparse.ArgumentParser:
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            sys.stderr.write(f"corral exec: {message}\n")
            raise SystemExit(EXIT_USAGE)

        def print_help(self, file: SupportsWrite[str] | None = None) -> None:
            from corral.helpview import print_argparse_help

            print_argparse_help(self, "corral exec [OPTIONS] -- CMD [ARG...]")

    p = _Parser(
        prog="corral exec",
        description="Run one command in a sandbox.",
        usage="corral exec [options] -- CMD [ARG...]",
    )
    p.add_argument("--workspace", default=None, help="writable project directory (default: cwd)")
    p.add_argument(
        "--env", dest="env_kind", default="exec", choices=["exec", "agent", "product", "verifier"]
    )
    p.add_argument("--memory", default=None, help="memory limit incl. swap, e.g. 512M")
    p.add_argument("--disk", default=None, help="size of each writable scratch tmpfs, e.g. 256M")
    p.add_argument("--cpus", default=None, help="CPU quota, e.g. 0.5")
    p.add_argument("--pids", default=None, help="max processes+threads")
    p.add_argument("--timeout", default=None, help="wall-clock limit, e.g. 600 or 10m")
    p.add_argument(
        "--allow", action="append", default=[], metavar="HOST[:PORT]", help="egress destination"
    )
    p.add_argument(
        "--host-service",
        action="append",
        default=[],
        metavar="NAME=PORT",
        help="host loopback port reachable in the sandbox as NAME.corral.internal:PORT",
    )
    p.add_argument("--ro", action="append", default=[], metavar="PATH", help="extra read-only path")
    p.add_argument("--rw", action="append", default=[], metavar="PATH", help="extra writable path")
    p.add_argument(
        "--allow-unix",
        action="append",
        default=[],
        metavar="PATH",
        help="host unix socket the sandbox may connect to (in the workspace or a --ro/--rw path)",
    )
    p.add_argument(
        "--backend",
        default="namespace",
        metavar="KIND",
        help="isolation: namespace (default), gvisor or microvm",
    )
    p.add_argument("--journal", default=None, metavar="FILE", help="journal SQLite file")
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="corral.toml with broker routes/rules (never read from the workspace)",
    )
    p.add_argument(
        "--run",
        dest="run_id",
        default=None,
        metavar="ID",
        help="run id recorded in the journal (default: exec-<random>)",
    )
    p.add_argument(
        "--session",
        dest="session_id",
        default=None,
        metavar="ID",
        help="session id recorded in the journal",
    )
    p.add_argument(
        "--setenv",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment variable for the command",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary on stderr at the end")
    p.add_argument(
        "--allow-degraded",
        action="append",
        default=[],
        metavar="LAYER",
        choices=list(LAYERS),
        help="run even though this protection layer is unavailable",
    )
    p.add_argument(
        "--unprotect",
        action="append",
        default=[],
        metavar="NAME",
        help="let the command write this host-executed workspace name (e.g. .git, .envrc)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the bubblewrap command line and exit"
    )
    return p


def _glue_dash_values(parser: argparse.ArgumentParser, opts: list[str]) -> list[str]:
    """`--memory -5M` as `--memory=-5M`, so the value's own check reports it.

    argparse takes a word starting with `-` after an option for another option
    and says only "expected one argument".
    """
    takes_value = {
        s for a in parser._actions if a.nargs is None and a.option_strings for s in a.option_strings
    }
    out: list[str] = []
    i = 0
    while i < len(opts):
        word = opts[i]
        nxt = opts[i + 1] if i + 1 < len(opts) else None
        if (
            word in takes_value
            and nxt is not None
            and nxt.startswith("-")
            and nxt.split("=", 1)[0] not in parser._option_string_actions
        ):
            out.append(f"{word}={nxt}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


class Options:
    """`corral exec`'s parsed options (the same names argparse's Namespace had)."""

    __slots__ = _FIELDS = (
        "workspace", "env_kind", "memory", "disk", "cpus", "pids", "timeout", "allow",
        "host_service", "ro", "rw", "allow_unix", "backend", "journal", "config", "run_id",
        "session_id", "setenv", "json", "allow_degraded", "unprotect", "dry_run",
    )  # fmt: skip
    workspace: str | None
    env_kind: EnvKind
    memory: str | None
    disk: str | None
    cpus: str | None
    pids: str | None
    timeout: str | None
    allow: list[str]
    host_service: list[str]
    ro: list[str]
    rw: list[str]
    allow_unix: list[str]
    backend: str
    journal: str | None
    config: str | None
    run_id: str | None
    session_id: str | None
    setenv: list[str]
    json: bool
    allow_degraded: list[str]
    unprotect: list[str]
    dry_run: bool

    def __init__(self, values: dict[str, object]) -> None:
        for name in self._FIELDS:
            setattr(self, name, values[name])

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self._FIELDS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable lists inside

    def __repr__(self) -> str:
        return f"Options({self.as_dict()!r})"


#: `--option`: (dest, kind, choices); kind "value" (last wins), "append" or "flag".
_OPTIONS: dict[str, tuple[str, str, tuple[str, ...] | None]] = {
    "--workspace": ("workspace", "value", None),
    "--env": ("env_kind", "value", ("exec", "agent", "product", "verifier")),
    "--memory": ("memory", "value", None),
    "--disk": ("disk", "value", None),
    "--cpus": ("cpus", "value", None),
    "--pids": ("pids", "value", None),
    "--timeout": ("timeout", "value", None),
    "--allow": ("allow", "append", None),
    "--host-service": ("host_service", "append", None),
    "--ro": ("ro", "append", None),
    "--rw": ("rw", "append", None),
    "--allow-unix": ("allow_unix", "append", None),
    "--backend": ("backend", "value", None),
    "--journal": ("journal", "value", None),
    "--config": ("config", "value", None),
    "--run": ("run_id", "value", None),
    "--session": ("session_id", "value", None),
    "--setenv": ("setenv", "append", None),
    "--json": ("json", "flag", None),
    "--allow-degraded": ("allow_degraded", "append", LAYERS),
    "--unprotect": ("unprotect", "append", None),
    "--dry-run": ("dry_run", "flag", None),
}


def _defaults() -> dict[str, object]:
    out: dict[str, object] = {}
    for dest, kind, _ in _OPTIONS.values():
        out[dest] = [] if kind == "append" else False if kind == "flag" else None
    out["env_kind"] = "exec"
    out["backend"] = "namespace"
    return out


def _fast_parse(opts: list[str]) -> Options | None:
    """The options argparse would produce, or None for anything it must judge.

    Only exact option names (no abbreviations), values that do not start
    with `-`, and valid choices are taken here; help, errors and every other
    form are argparse's, so both paths agree on what they both accept
    (tests/unit/exec/test_fast_parse.py). Skipping argparse spares
    `corral exec` its import (with gettext, locale and shutil).
    """
    values = _defaults()
    i = 0
    while i < len(opts):
        word = opts[i]
        name, eq, inline = word.partition("=")
        entry = _OPTIONS.get(name)
        if entry is None:
            return None
        dest, kind, choices = entry
        if kind == "flag":
            if eq:
                return None
            values[dest] = True
            i += 1
            continue
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(opts) or opts[i + 1].startswith("-"):
                return None
            value = opts[i + 1]
            i += 2
        if choices is not None and value not in choices:
            return None
        if kind == "append":
            current = values[dest]
            assert isinstance(current, list)
            current.append(value)
        else:
            values[dest] = value
    return Options(values)


def parse_args(argv: Sequence[str]) -> tuple[Options, list[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        fast = _fast_parse(argv[:i])
        if fast is not None and argv[i + 1 :]:
            return fast, argv[i + 1 :]
    return _parse_slow(argv)


def _parse_slow(argv: list[str]) -> tuple[Options, list[str]]:
    if "--" in argv:
        i = argv.index("--")
        opts, cmd = argv[:i], argv[i + 1 :]
    else:
        # Without `--`, the first word that is not an option (or an option's
        # value) starts the command.
        opts, cmd = argv, []
    parser = _parser()
    ns, rest = parser.parse_known_args(_glue_dash_values(parser, opts))
    if rest:
        if "--" in argv or rest[0].startswith("-"):
            _parser().error(f"unrecognized arguments: {' '.join(rest)}")
        idx = len(opts) - len(rest)
        if opts[idx:] != rest:
            _parser().error(f"unrecognized arguments: {' '.join(rest)}")
        cmd = rest
    if not cmd:
        _parser().error("no command given (usage: corral exec [options] -- CMD [ARG...])")
    return Options(vars(ns)), cmd


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def validate_path(raw: str, what: str, *, writable: bool, home: str) -> str:
    """Resolve a user path; refuse ones that would expose the host.

    Resolution follows no symlink but the top-level system aliases (see
    `grants`): a link a sandbox planted cannot redirect a later grant.
    """
    from corral.sandbox.grants import resolve_grant

    path = resolve_grant(raw, what)
    if path == "/":
        raise UsageError(f"{what} cannot be /")
    if _within(home, path):
        raise UsageError(
            f"{what} {path} contains your home directory {home}; choose a project directory"
        )
    for tree in _SYSTEM_TREES:
        if _within(tree, path) or (writable and _within(path, tree)):
            raise UsageError(f"{what} {path} overlaps the system directory {tree}")
    return path


def validate_unix_grant(raw: str, trees: Sequence[str]) -> str:
    """An `--allow-unix` path: an existing socket the sandbox can see (inside a bound tree)."""
    path = os.path.realpath(raw)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"--allow-unix {raw}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise UsageError(f"--allow-unix {raw} is not a unix socket")
    if not any(_within(path, t) for t in trees):
        raise UsageError(f"--allow-unix {raw} is not inside the workspace or a --ro/--rw path")
    return path


def sandbox_env(
    home: str, caller: dict[str, str], extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The command's whole environment: an allowlist, never the caller's secrets."""
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "TMPDIR": "/tmp",
        "USER": "corral",
        "LOGNAME": "corral",
        "SHELL": "/bin/sh",
        "LANG": caller.get("LANG", "C.UTF-8") or "C.UTF-8",
    }
    if caller.get("TERM"):
        env["TERM"] = caller["TERM"]
    if extra:
        env.update(extra)
    return env


def build_spec(ns: Options, cmd: list[str], caller_env: dict[str, str]) -> SandboxSpec:
    home = os.path.realpath(os.path.expanduser("~"))
    ws_raw = ns.workspace if ns.workspace is not None else os.getcwd()
    if not os.path.exists(ws_raw):
        raise UsageError(f"workspace {ws_raw} does not exist")
    if not os.path.isdir(ws_raw):
        raise UsageError(f"workspace {ws_raw} is not a directory")
    from corral.sandbox.protect import validate_unprotect

    workspace = validate_path(ws_raw, "workspace", writable=True, home=home)
    binds: list[Bind] = []
    for p in ns.ro:
        binds.append(Bind(validate_path(p, "--ro path", writable=False, home=home), writable=False))
    for p in ns.rw:
        binds.append(Bind(validate_path(p, "--rw path", writable=True, home=home), writable=True))
    writable = [workspace, *(b.path for b in binds if b.writable)]
    refuse_corral_state(writable)
    from corral.exec.sockdirs import refuse_socket_dirs

    refuse_socket_dirs([workspace, *(b.path for b in binds)], caller_env)
    if ns.journal is not None:
        refuse_in_writable(ns.journal, "--journal", writable)
    limits = Limits(
        memory_bytes=parse_size(ns.memory) if ns.memory is not None else None,
        pids=_parse_pids(ns.pids) if ns.pids is not None else None,
        cpus=parse_cpus(ns.cpus, len(os.sched_getaffinity(0))) if ns.cpus is not None else None,
        timeout_s=parse_duration(ns.timeout) if ns.timeout is not None else None,
        disk_bytes=parse_size(ns.disk) if ns.disk is not None else None,
    )
    spec_home = "/home/corral"
    extra = _setenv(ns.setenv)
    config_json = broker_config_json(ns.allow, ns.config, writable, ns.host_service)
    ssh_config: str | None = None
    if config_json is not None:
        from corral.broker.config import BrokerConfig
        from corral.broker.proxy_env import sandbox_proxy_env
        from corral.broker.tcp import sandbox_env_for, sandbox_ssh_config
        from corral.sandbox.spec import SANDBOX_PROXY_PORT

        parsed = BrokerConfig.from_json(config_json)
        tcp_env = sandbox_env_for(parsed, SANDBOX_PROXY_PORT)
        ssh_config = sandbox_ssh_config(parsed, SANDBOX_PROXY_PORT)
        extra = {**sandbox_proxy_env(), **tcp_env, **extra}
    else:
        from corral.sandbox.nodns import no_egress_env

        extra = {**no_egress_env(), **extra}
    return SandboxSpec(
        argv=tuple(cmd),
        workspace=workspace,
        env=tuple(sorted(sandbox_env(spec_home, caller_env, extra).items())),
        binds=tuple(binds),
        limits=limits,
        network=NetworkSpec(
            allow=tuple(ns.allow), broker_config=config_json, ssh_config=ssh_config
        ),
        env_kind=ns.env_kind,
        home=spec_home,
        allow_degraded=frozenset(ns.allow_degraded),
        run_id=ns.run_id,
        session_id=ns.session_id,
        protect=True,
        unprotect=validate_unprotect(ns.unprotect),
        allow_unix=tuple(
            validate_unix_grant(p, [workspace, *(b.path for b in binds)]) for p in ns.allow_unix
        ),
    )


def _setenv(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if (
            not sep
            or not name
            or not (name[0].isalpha() or name[0] == "_")
            or not all(c.isalnum() or c == "_" for c in name)
        ):
            raise UsageError(f"--setenv takes NAME=VALUE, not {item!r}")
        out[name] = value
    return out


#: What `corral run` and `corral agent run` keep below a project directory.
_CORRAL_STATE = (".corral/runs", ".corral/agent")


def refuse_in_writable(path: str, what: str, writable: Sequence[str]) -> None:
    """Refuse a host state file (journal, config) inside a tree the sandbox can write.

    Inside, the sandbox could rewrite it: drop the journal's append-only
    triggers and its own denials, or grant itself egress for a later run.
    """
    from corral.sandbox.placement import writable_tree_of

    tree = writable_tree_of(path, writable)
    if tree is not None:
        where = "the workspace" if tree == writable[0] else f"the writable path {tree}"
        raise UsageError(f"{what} {path} is inside {where}, which the sandbox can write")


def refuse_corral_state(writable: Sequence[str], cache: str | None = None) -> None:
    """Refuse writable trees that hold corral's state: runs, agent state, its cache.

    The cache (`cache`, default the namespace backend's) holds the compiled
    init and seccomp filter the next sandbox starts with.
    """
    from corral.sandbox.placement import writable_tree_of

    if cache is None:
        from corral.sandbox.namespace import cache_dir

        cache = cache_dir()
    tree = writable_tree_of(cache, writable)
    if tree is None and os.path.isdir(cache):
        tree = next((t for t in writable if writable_tree_of(t, [cache])), None)
    if tree is not None:
        raise UsageError(
            f"{tree} overlaps corral's cache {cache} (the init and seccomp filter of every "
            "sandbox); choose another directory"
        )
    for tree in writable:
        for sub in _CORRAL_STATE:
            if os.path.lexists(os.path.join(tree, sub)):
                raise UsageError(
                    f"{tree} contains {sub} (corral's state, journals and reports), which the "
                    "sandbox could rewrite; use a directory without it"
                )
        # A run directory, or any part of one but its workspace (git/ is the
        # host's trusted repository, sessions/ and report.md the record).
        # `tree` is a real path, so its string parents are its ancestors.
        run = tree
        while True:
            if os.path.isfile(os.path.join(run, "state.sqlite")) and os.path.isfile(
                os.path.join(run, "run.json")
            ):
                if not _within(tree, os.path.join(run, "workspace")):
                    raise UsageError(
                        f"{tree} is inside the corral run directory {run}; only its "
                        "workspace/ may be handed to a sandbox"
                    )
                break
            if run == "/":
                break
            run = os.path.dirname(run)


def broker_config_json(
    allow: list[str],
    config_path: str | None,
    writable: Sequence[str],
    host_services: Sequence[str] = (),
) -> str | None:
    """The broker configuration from `--allow` flags and a corral.toml, or None for no egress.

    The config file may not live in a writable tree (`writable[0]` is the
    workspace): the sandbox must not be able to grant itself egress for a
    later run.
    """
    doc: dict[str, object] = {}
    if config_path is not None:
        real = os.path.realpath(config_path)
        if not os.path.isfile(real):
            raise UsageError(f"--config {config_path} is not a file")
        refuse_in_writable(config_path, "--config", writable)
        import tomllib

        try:
            with open(real, "rb") as fh:
                doc = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"--config {config_path}: {exc}") from exc
    if not allow and not doc and not host_services:
        return None
    from corral.broker.config import BrokerConfig
    from corral.errors import ConfigError

    extra_allow = doc.pop("allow", [])
    if not isinstance(extra_allow, list):
        raise UsageError(f"--config {config_path}: 'allow' must be a list of HOST[:PORT]")
    try:
        base = BrokerConfig.from_allow_flags([*allow, *map(str, extra_allow)]).model_dump()
        rules = doc.pop("rules", [])
        if not isinstance(rules, list):
            raise UsageError(f"--config {config_path}: 'rules' must be an array of tables")
        merged = {**base, **doc, "rules": [*base["rules"], *rules]}
        if host_services:
            from corral.broker.tcp import parse_host_service_flag

            flagged = [parse_host_service_flag(f).model_dump() for f in host_services]
            listed = doc.get("host_services", [])
            merged["host_services"] = [
                *(listed if isinstance(listed, list) else [listed]),
                *flagged,
            ]
        return BrokerConfig.model_validate(merged).to_json()
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    except ValueError as exc:
        first = str(exc).splitlines()
        raise UsageError(f"invalid broker configuration: {' '.join(first[:3])}") from exc


def _parse_pids(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise UsageError(f"invalid pids limit {text!r} (a whole number)") from None
    if n < 1:
        raise UsageError(f"pids limit must be at least 1: {text!r}")
    return n


class _Interrupted(BaseException):
    """A signal to corral: like KeyboardInterrupt, not for `except Exception` to swallow."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: The first signal that arrived, kept for when its exception was lost anyway.
_first_signal: list[int] = []


def interrupt(signum: int) -> None:
    """Record `signum` and raise it into what the main thread is doing, or as soon
    as a backend holds the handle of the process it is creating."""
    if not _first_signal:
        _first_signal.append(signum)

    def fire() -> None:
        raise _Interrupted(signum)

    interrupts.deliver(fire)


def pending_signal() -> int:
    return _first_signal[0] if _first_signal else 0


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    interrupt(signum)


def run_exec(argv: Sequence[str]) -> int:
    """Entry point of `corral exec`; returns the exit status."""
    ns, cmd = parse_args(argv)
    try:
        spec = build_spec(ns, cmd, dict(os.environ))
    except UsageError as exc:
        sys.stderr.write(f"corral exec: {exc}\n")
        return EXIT_USAGE
    from corral.sandbox.backend_config import backend_config

    try:
        config = backend_config(ns.backend)
    except CorralError as exc:
        sys.stderr.write(f"corral exec: {exc}\n")
        return EXIT_USAGE

    from corral.exec.compose import execute

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)
    try:
        result = execute(
            spec,
            backend=config,
            journal=ns.journal,
            dry_run=ns.dry_run,
            interrupted_exc=_Interrupted,
            pending_signal=pending_signal,
        )
    except _Interrupted as exc:
        # Before the sandbox was whole (its start tore down what it had).
        return 128 + exc.signum
    except LayerUnavailableError as exc:
        sys.stderr.write(f"corral exec: refused: {exc}\n")
        _json_refused(ns.json, str(exc), exc.layer)
        return EXIT_REFUSED
    except SandboxStartError as exc:
        sys.stderr.write(f"corral exec: cannot start the sandbox: {exc.strerror or exc}\n")
        _json_refused(ns.json, str(exc.strerror or exc), None)
        return EXIT_REFUSED
    except CorralError as exc:
        sys.stderr.write(f"corral exec: {exc}\n")
        _json_refused(ns.json, str(exc), None)
        return EXIT_REFUSED
    if result is None:  # dry run
        return 0
    summary, code = result
    if ns.json:
        sys.stderr.write(json.dumps(summary) + "\n")
    return code


def rehearse() -> None:
    """Run the request path's checks once on a throwaway request (a warm worker, before its own).

    A worker shares the launcher's heap copy-on-write: the first call of each
    function writes refcounts and caches into pages it then copies, one fault
    each (measured: ~550 faults and 2.5-4 ms for parse, `build_spec` and the
    layer checks on a worker's first request, 0.9-1.2 ms on its second).
    Nothing computed here is kept: the request decides everything again from
    its own arguments and the host as it then is. Best effort and silent.
    """
    import contextlib
    import tempfile

    with contextlib.suppress(Exception):
        # A directory of our own: any existing one might be, or become, refused.
        ws = tempfile.mkdtemp(prefix="corral-rehearse-")
        try:
            ns, cmd = parse_args(["--workspace", ws, "--", "true"])
            spec = build_spec(ns, cmd, dict(os.environ))
            from corral.sandbox.backend_config import backend_config, load_backend

            load_backend(backend_config(ns.backend))
            from corral.sandbox.namespace import NamespaceSandbox

            NamespaceSandbox(spec)._check_layers()
            from corral.sandbox.namespace import preview_argv, preview_stage

            # What --dry-run prints: the builders `start` runs too (init_binary among them).
            preview_argv(spec)
            preview_stage(spec)
        finally:
            os.rmdir(ws)


def _json_refused(enabled: bool, message: str, layer: str | None) -> None:
    if enabled:
        sys.stderr.write(
            json.dumps(
                {
                    "exit": EXIT_REFUSED,
                    "reason": "refused",
                    "wall_s": 0.0,
                    "cpu_s": 0.0,
                    "peak_memory_bytes": 0,
                    "processes_killed_at_end": 0,
                    "observations": {"allowed": 0, "denied": 0},
                    "layers": {},
                    "message": message,
                    "layer": layer,
                }
            )
            + "\n"
        )


def quote_argv(argv: Sequence[str]) -> str:
    """Shell-quoted argv for the terminal. The argv holds workspace names
    (protected paths), so an argument with a control character or an
    undecodable byte is written in ANSI-C quoting (`$'...\\x1b...'`): exact
    for bash and zsh, and no raw control byte reaches the terminal."""
    return " ".join(_quote(a) for a in argv)


def _quote(arg: str) -> str:
    if arg.isprintable() and not any(0xDC80 <= ord(c) <= 0xDCFF for c in arg):
        import shlex

        return shlex.quote(arg)
    raw = os.fsencode(arg)
    return (
        "$'"
        + "".join(
            chr(b) if 0x20 <= b < 0x7F and b not in (0x27, 0x5C) else f"\\x{b:02x}" for b in raw
        )
        + "'"
    )
