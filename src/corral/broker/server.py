"""The broker process: sockets, secrets, journal, signals (the I/O shell).

`serve(options)` returns the process exit status:

- 0 after SIGTERM/SIGINT: listeners closed, connections cut, journal flushed;
- 1 when the broker cannot start (journal unwritable, a socket unusable), or
  when a listener fails while serving (after the same clean shutdown);
- 2 when the configuration is rejected (bad rule, missing secret, bad hook).

Before reporting ready it commits a `process_event`/`broker_start` row, so a
ready broker has a working journal. Listening sockets are owned by this
process only when the launcher closed its own copies; then the broker's
death (SIGKILL included) closes them and every tunnel it carried, and the
sandbox has no way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import importlib
import json
import os
import signal
import socket
import ssl
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.broker.actions import Identity, Observation, ProcessEvent
from corral.broker.config import BrokerConfig, parse_secret_ref
from corral.broker.control import ControlServer, bind_control_socket
from corral.broker.credentials import Credential, Credentials
from corral.broker.journal import GroupCommitJournal, Journal
from corral.broker.metering import SessionBudget
from corral.broker.pgjournal import open_journal
from corral.broker.policy import Hook, Policy
from corral.broker.proxy import BrokerState, ProxyServer, RouteSecrets
from corral.broker.resolver import Resolver
from corral.errors import BrokerError, ConfigError, CorralError, UsageError

if TYPE_CHECKING:
    from corral.broker.mitm import CertAuthority

__all__ = [
    "Prepared",
    "ServeOptions",
    "load_credentials",
    "load_route_secrets",
    "prepare",
    "serve",
]

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServeOptions:
    """What `python -m corral.broker serve` was asked to do."""

    config: BrokerConfig
    journal: Path
    identity: Identity = field(default_factory=Identity)
    listen_fds: tuple[int, ...] = ()
    listen: tuple[str, ...] = ()
    listen_unix: tuple[str, ...] = ()
    ready_fd: int | None = None
    parent_pid: int | None = None
    control: Path | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def _read_secret(ref: str, environ: Mapping[str, str], who: str, what: str) -> str:
    """The value `ref` (`env:NAME` or `file:PATH`, first line) names, as a header
    value; ConfigError starting with `who` when it is missing or unusable."""
    source, where = parse_secret_ref(ref)
    if source == "env":
        value = environ.get(where)
        if value is None:
            raise ConfigError(f"{who}: ${where} is not set in the broker's environment")
    else:
        try:
            with open(where, encoding="utf-8") as fh:
                value = fh.readline().strip()
        except OSError as exc:
            raise ConfigError(f"{who}: cannot read {where}: {exc}") from exc
    if not value or any(c in value for c in "\r\n\0"):
        raise ConfigError(f"{who}: {what} is empty or not a header value")
    return value


def load_route_secrets(config: BrokerConfig, environ: Mapping[str, str]) -> dict[str, RouteSecrets]:
    """Read each route's injected credentials; ConfigError names a missing one."""
    out: dict[str, RouteSecrets] = {}
    for name, route in config.routes.items():
        inject: list[tuple[bytes, bytes]] = []
        for header, ref in route.inject_header.items():
            value = _read_secret(ref, environ, f"route {name}", f"secret for {header}")
            inject.append((header.encode("ascii"), value.encode("utf-8")))
        strip = frozenset(h.encode("ascii") for h in route.strip_headers)
        if route.meter_usage or route.token_budget is not None:
            # The meter reads the body as relayed; it cannot read compressed ones.
            strip |= {b"accept-encoding"}
            inject.append((b"accept-encoding", b"identity"))
        out[name] = RouteSecrets(tuple(inject), strip)
    return out


def load_credentials(config: BrokerConfig, environ: Mapping[str, str]) -> Credentials:
    """Read each credential's real value; ConfigError names a missing one."""
    items: list[Credential] = []
    for cred in config.credentials:
        if not cred.placeholder:
            raise ConfigError(f"credential {cred.name}: no placeholder was assigned")
        value = _read_secret(cred.value, environ, f"credential {cred.name}", "the value")
        items.append(
            Credential(
                name=cred.name,
                placeholder=cred.placeholder.encode(),
                value=value.encode("utf-8"),
                hosts=frozenset(cred.hosts),
                in_body=cred.in_body,
            )
        )
    return Credentials(items)


def _load_ca(config: BrokerConfig) -> CertAuthority | None:
    if config.mitm is None:
        return None
    from corral.broker.mitm import CertAuthority

    return CertAuthority.load(config.mitm.ca_cert, config.mitm.ca_key, config.mitm.max_leaf_certs)


def _load_hooks(refs: Sequence[str]) -> tuple[tuple[str, Hook], ...]:
    hooks: list[tuple[str, Hook]] = []
    for ref in refs:
        module, _, attr = ref.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load policy hook {ref}: {exc}") from exc
        if not callable(fn):
            raise ConfigError(f"policy hook {ref} is not callable")
        hooks.append((ref, fn))
    return tuple(hooks)


def _tls_context(config: BrokerConfig) -> ssl.SSLContext:
    tls = config.upstream_tls
    try:
        ctx = ssl.create_default_context(cafile=tls.ca_bundle)
        if tls.ca_bundle is not None:
            # An extra bundle (host configuration only) adds to the host's store.
            ctx.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load CA bundle {tls.ca_bundle}: {exc}") from exc
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _parse_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen wants HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def _listeners(options: ServeOptions) -> list[socket.socket]:
    socks: list[socket.socket] = []
    try:
        for fd in options.listen_fds:
            try:
                sock = socket.socket(fileno=fd)
            except OSError as exc:
                raise BrokerError(f"--listen-fd {fd}: not a socket: {exc}") from exc
            socks.append(sock)
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                raise BrokerError(f"--listen-fd {fd}: socket is not listening")
        for text in options.listen:
            host, port = _parse_hostport(text)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(512)
        for path in options.listen_unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(path)
            sock.listen(512)
    except OSError as exc:
        for s in socks:
            s.close()
        raise BrokerError(f"cannot listen: {exc}") from exc
    except CorralError:
        for s in socks:
            s.close()
        raise
    if not socks:
        for s in socks:
            s.close()
        raise UsageError("nothing to listen on: give --listen-fd, --listen or --listen-unix")
    for s in socks:
        s.setblocking(False)
    return socks


def _describe(sock: socket.socket) -> dict[str, Any]:
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return {"fd": sock.fileno(), "family": "unix", "path": name}
    return {"fd": sock.fileno(), "family": "tcp", "host": name[0], "port": name[1]}


def _own_endpoints(socks: Sequence[socket.socket]) -> frozenset[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for s in socks:
        if s.family in (socket.AF_INET, socket.AF_INET6):
            host, port = s.getsockname()[:2]
            out.add((str(host), int(port)))
            if host in ("127.0.0.1", "::1", "0.0.0.0", "::"):
                out.update({("localhost", port), ("127.0.0.1", port), ("::1", port)})
    return frozenset(out)


def _die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise BrokerError(f"prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}")
    # The parent may have died before prctl took effect.
    if os.getppid() != parent_pid:
        raise BrokerError(f"parent {parent_pid} is gone")


def _write_ready(fd: int | None, payload: dict[str, Any]) -> None:
    line = ("ready " + json.dumps(payload, separators=(",", ":")) + "\n").encode()
    if fd is None:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
        return
    view = memoryview(line)
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


async def _start_control(
    options: ServeOptions, state: BrokerState, sock: socket.socket | None
) -> ControlServer | None:
    if sock is None or options.control is None:
        return None
    hooks = state.policy.hooks

    def apply(config: BrokerConfig) -> None:
        state.policy = Policy.from_config(config, hooks)

    control = ControlServer(
        sock,
        options.control,
        config=options.config,
        apply=apply,
        journal=state.journal,
        identity=state.identity,
        journal_path=options.journal,
    )
    await control.start()
    return control


async def _main(
    options: ServeOptions,
    state: BrokerState,
    socks: list[socket.socket],
    control_sock: socket.socket | None = None,
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    failures: list[BaseException] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def fatal(exc: BaseException) -> None:
        print(f"corral broker: listener failed: {exc}", file=sys.stderr)
        failures.append(exc)
        stop.set()

    server = ProxyServer(state, fatal)
    identity = state.identity
    listen = [_describe(s) for s in socks]
    start = ProcessEvent(event="broker_start", pid=os.getpid(), name="corral-broker")
    await state.journal.append(
        Observation.of(
            start,
            identity,
            decision="observe",
            rule=None,
            reason="broker started",
            detail={
                "config_sha256": hashlib.sha256(options.config.to_json().encode()).hexdigest(),
                "listen": listen,
                "rules": [r.id for r in options.config.rules],
                "routes": sorted(options.config.routes),
                "tcp": [t.id for t in options.config.tcp],
                "host_services": {h.name: h.port for h in options.config.host_services},
                # Its timers stop while the run is paused (`corral.broker.pauseloop`).
                **({"pauses": options.config.pauses} if options.config.pauses else {}),
            },
        )
    )
    control = await _start_control(options, state, control_sock)
    server.start(socks)
    _write_ready(
        options.ready_fd, {"pid": os.getpid(), "listen": listen, "journal": str(options.journal)}
    )
    await stop.wait()
    if control is not None:
        await control.aclose()
    await server.stop_accepting()
    for s in socks:
        # Refuse new connections at once, before in-flight ones are cut.
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
    await server.aclose()
    for s in socks:
        s.close()
    stop_event = ProcessEvent(event="broker_stop", pid=os.getpid(), name="corral-broker")
    reason = f"broker stopped: listener failed: {failures[0]}" if failures else "broker stopped"
    with contextlib.suppress(Exception):
        await state.journal.append(
            Observation.of(stop_event, identity, decision="observe", rule=None, reason=reason)
        )
    state.journal.flush()
    return 1 if failures else 0


@dataclass(frozen=True, slots=True)
class Prepared:
    """A configuration checked and loaded (secrets read, policy compiled), not yet serving."""

    config: BrokerConfig
    policy: Policy
    secrets: Mapping[str, RouteSecrets]
    credentials: Credentials
    ca: CertAuthority | None
    tls: ssl.SSLContext
    tcp_policy: Policy | None

    def state(
        self, journal: GroupCommitJournal, identity: Identity, socks: Sequence[socket.socket]
    ) -> BrokerState:
        """The connection handlers' state for these listeners and this journal."""
        config = self.config
        return BrokerState(
            policy=self.policy,
            journal=journal,
            identity=identity,
            resolver=Resolver(
                config.resolver_overrides, config.system_dns, config.limits.resolve_timeout_s
            ),
            limits=config.limits,
            tls=self.tls,
            routes=self.secrets,
            own_endpoints=_own_endpoints(socks),
            budgets={
                name: SessionBudget(route.token_budget)
                for name, route in config.routes.items()
                if route.meter_usage or route.token_budget is not None
            },
            credentials=self.credentials,
            ca=self.ca,
            tcp_policy=self.tcp_policy,
        )


def prepare(
    config: BrokerConfig,
    environ: Mapping[str, str],
    tls_context: Callable[[BrokerConfig], ssl.SSLContext] | None = None,
) -> Prepared:
    """Load everything `config` names; ConfigError (or BrokerError) when it cannot be served.

    `tls_context` builds the upstream TLS context (default: a fresh one; the
    resident broker passes a cache, since loading the host's CA store is the
    dearest step).
    """
    from corral.broker.tcp import expand_host_services, tcp_policy

    config = expand_host_services(config)
    secrets = load_route_secrets(config, environ)
    credentials = load_credentials(config, environ)
    ca = _load_ca(config)
    hooks = _load_hooks(config.hooks)
    policy = Policy.from_config(config, hooks)
    tls = (tls_context or _tls_context)(config)
    return Prepared(
        config=config,
        policy=policy,
        secrets=secrets,
        credentials=credentials,
        ca=ca,
        tls=tls,
        tcp_policy=tcp_policy(config, hooks) if config.tcp else None,
    )


def serve(options: ServeOptions) -> int:
    """Run the broker until SIGTERM; the exit status (see the module docstring)."""
    socks: list[socket.socket] = []
    journal: Journal | None = None
    control_sock: socket.socket | None = None
    try:
        if options.parent_pid is not None:
            _die_with_parent(options.parent_pid)
        prepared = prepare(options.config, options.environ)
        socks = _listeners(options)
        journal = open_journal(options.journal, options.config.journal_synchronous, options.environ)
        state = prepared.state(GroupCommitJournal(journal), options.identity, socks)
        if options.control is not None:
            control_sock = bind_control_socket(options.control)
        from corral.broker.pauseloop import loop_factory

        with asyncio.Runner(loop_factory=loop_factory(options.config.pauses)) as runner:
            return runner.run(_main(options, state, socks, control_sock))
    except (ConfigError, UsageError) as exc:
        print(f"corral broker: {exc}", file=sys.stderr)
        return 2
    except (CorralError, OSError) as exc:
        print(f"corral broker: cannot start: {exc}", file=sys.stderr)
        return 1
    finally:
        for s in socks:
            s.close()
        if control_sock is not None and options.control is not None:
            control_sock.close()
            # An exit before or after serving: no socket file outlives the broker.
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(options.control).st_mode):
                    os.unlink(options.control)
        if journal is not None:
            journal.close()
