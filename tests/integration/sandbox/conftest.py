"""Fixtures for running the real `corral exec` CLI as a user would."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class ExecOutcome:
    code: int
    stdout: str
    stderr: str
    summary: dict[str, object]


ExecFn = Callable[..., ExecOutcome]


def corral_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "corral", "exec", *args]


def parse_summary(stderr: str) -> dict[str, object]:
    for line in reversed(stderr.strip().splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return {}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o700)
    return ws


@pytest.fixture
def corral_exec(workspace: Path) -> ExecFn:
    def run(
        *cmd: str,
        opts: tuple[str, ...] = (),
        timeout: float = 60,
        env: dict[str, str] | None = None,
        ws: Path | None = None,
    ) -> ExecOutcome:
        argv = corral_argv("--workspace", str(ws or workspace), "--json", *opts, "--", *cmd)
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env if env is not None else dict(os.environ),
        )
        return ExecOutcome(proc.returncode, proc.stdout, proc.stderr, parse_summary(proc.stderr))

    return run


@pytest.fixture
def marker() -> str:
    return f"corral-marker-{secrets.token_hex(6)}"


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(name))
    return found


def wait_for(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


@pytest.fixture
def host_canary(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A secret file in the caller's home directory."""
    secret = f"CANARY-{secrets.token_hex(8)}"
    home = Path(os.path.expanduser("~"))
    path = home / f".corral-test-canary-{secrets.token_hex(4)}"
    path.write_text(secret)
    path.chmod(0o644)
    try:
        yield path, secret
    finally:
        path.unlink(missing_ok=True)
