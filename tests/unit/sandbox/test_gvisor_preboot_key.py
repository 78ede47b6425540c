"""gvisor.preboot's pure parts: which requests a pre-booted sandbox may serve, and
the request the supervisor reads (gvsup.c read_request)."""

from __future__ import annotations

import dataclasses

import pytest

from corral.sandbox.backend import GVisorConfig
from corral.sandbox.gvisor import bundle as bd
from corral.sandbox.gvisor.preboot import boot_key
from corral.sandbox.spec import Bind, Limits, NetworkSpec, SandboxSpec

SPEC = SandboxSpec(argv=("true",), workspace="/home/u/proj", env=(("PATH", "/usr/bin"),))


def test_key_is_what_the_boot_needs() -> None:
    key = boot_key(SPEC, GVisorConfig(), "corral")
    assert key is not None
    assert (key.workspace, key.home, key.hostname, key.nproc) == (
        "/home/u/proj",
        "/home/corral",
        "corral",
        False,
    )
    # The command, its env and the limits' values come with the request.
    other = dataclasses.replace(
        SPEC, argv=("make",), env=(), limits=Limits(memory_bytes=1 << 30, cpus=0.5)
    )
    assert boot_key(other, GVisorConfig(), "corral") == key
    assert boot_key(SPEC, GVisorConfig(), "corral/run-1") != key
    assert boot_key(SPEC, GVisorConfig(platform="ptrace"), "corral") != key
    with_pids = dataclasses.replace(SPEC, limits=Limits(pids=10))
    assert boot_key(with_pids, GVisorConfig(), "corral") != key


@pytest.mark.parametrize(
    "ws",
    [
        "/proj",  # parent / : the stage would replace the root
        "/tmp/ws",  # parent /tmp: a tmpfs of the bundle
        "/home/corral/ws",  # the sandbox's home
        "/run/x",
        "/usr/src/x",  # below a read-only system bind
        "/etc/x",
        "/home/u/../proj",  # not normalised
    ],
)
def test_workspaces_a_stage_cannot_stand_in_for(ws: str) -> None:
    assert boot_key(dataclasses.replace(SPEC, workspace=ws), GVisorConfig(), "corral") is None


@pytest.mark.parametrize(
    "change",
    [
        {"binds": (Bind("/opt/data", False),)},
        {"allow_unix": ("/run/x.sock",)},
        {"network": NetworkSpec(allow=("example.org",), broker_config="{}")},
        {"network": NetworkSpec(trust_bundle="/tmp/ca.pem")},
    ],
)
def test_requests_that_need_more_at_boot_start_cold(change: dict[str, object]) -> None:
    assert boot_key(dataclasses.replace(SPEC, **change), GVisorConfig(), "corral") is None  # type: ignore[arg-type]


def test_request_wire() -> None:
    got = bd.encode_request(
        1000, 1000, nproc=64, cwd="/w", argv=("sh", "-c", "a b"), env=(("A", "1"), ("B", "x=y"))
    )
    fields = [b"1000", b"1000", b"64", b"/w", b"3", b"sh", b"-c", b"a b", b"A=1", b"B=x=y"]
    body = b"".join(f + b"\0" for f in fields)
    assert got == len(body).to_bytes(4, "little") + body
    none = bd.encode_request(1000, 1000, nproc=None, cwd="/w", argv=("true",), env=())
    assert none.endswith(b"".join(f + b"\0" for f in (b"-", b"/w", b"1", b"true")))


@pytest.mark.parametrize(
    "argv, env",
    [(("a\0b",), ()), (("true",), (("K", "v\0"),)), ((), ())],
)
def test_request_refuses_what_no_execve_could_take(
    argv: tuple[str, ...], env: tuple[tuple[str, str], ...]
) -> None:
    with pytest.raises(ValueError):
        bd.encode_request(1000, 1000, nproc=None, cwd="/w", argv=argv, env=env)
