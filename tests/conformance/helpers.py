"""Specs and small host-side oracles shared by the conformance tests."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from corral.exec.cli import sandbox_env
from corral.sandbox.backend import Backend, Sandbox, SandboxNet
from corral.sandbox.spec import ExecResult, Limits, SandboxSpec

PY = "/usr/bin/python3"


def spec(ws: Path, *argv: str, limits: Limits | None = None) -> SandboxSpec:
    return SandboxSpec(
        argv=tuple(argv),
        workspace=str(ws),
        env=tuple(sorted(sandbox_env("/home/corral", {}).items())),
        limits=limits or Limits(),
    )


def run(
    backend: Backend,
    s: SandboxSpec,
    *,
    timeout_s: float | None = 60.0,
    network: Callable[[SandboxNet], None] | None = None,
) -> ExecResult:
    running = backend.start(s, network=network)
    try:
        return running.wait(timeout_s)
    finally:
        running.close()


def until(pred: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    """Wait for a host-side fact; the limit only bounds a hang, it decides nothing."""
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def free_port() -> int:
    """A port free on the host's loopback now (the fake's SandboxNet is the host's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pids_with(marker: str) -> list[int]:
    """Host pids whose command line holds `marker` (the oracle for leftovers)."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != b"Z":
            out.append(int(name))
    return out


def start(backend: Backend, s: SandboxSpec) -> Sandbox:
    return backend.start(s)
