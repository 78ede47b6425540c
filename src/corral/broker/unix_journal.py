"""Journal rows for the unix-socket supervisor's decisions (`unix_connect`)."""

from __future__ import annotations

from collections.abc import Callable

from corral.sandbox.spec import SandboxSpec

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from corral.broker.journal import Journal

    class UnixConnectEvent(Protocol):
        """What the journal needs of a decided connect (`sandbox/unix_admit.py`
        produces them); declared here so that the broker needs no sandbox module."""

        @property
        def pid(self) -> int: ...
        @property
        def path(self) -> str: ...
        @property
        def allow(self) -> bool: ...
        @property
        def rule(self) -> str: ...
        @property
        def reason(self) -> str: ...
        @property
        def error(self) -> int: ...


__all__ = ["unix_observer"]


def unix_observer(
    journal: Journal, *, spec: SandboxSpec, run: str
) -> Callable[[UnixConnectEvent], None]:
    """Writes each decided unix connect as a `unix_connect` observation (before it happens)."""
    from corral.broker.actions import Identity, Observation, UnixConnect

    identity = Identity(run=run, session=spec.session_id, env=spec.env_kind)

    def record(ev: UnixConnectEvent) -> None:
        obs = Observation.of(
            UnixConnect(path=ev.path or "?", pid=ev.pid),
            identity,
            decision="allow" if ev.allow else "deny",
            rule=ev.rule,
            reason=ev.reason,
            detail={"errno": ev.error} if ev.error else {},
        )
        journal.append(obs)

    return record
