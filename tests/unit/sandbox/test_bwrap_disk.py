"""`--disk`: every writable scratch tmpfs gets a size (pure argv test)."""

from __future__ import annotations

from corral.sandbox.bwrap import BwrapPlan, build_argv
from corral.sandbox.spec import Limits, SandboxSpec


def _argv(limits: Limits, home: str = "/home/corral") -> list[str]:
    spec = SandboxSpec(argv=("true",), workspace="/work/p", env=(), limits=limits, home=home)
    plan = BwrapPlan(
        bwrap="/usr/bin/bwrap",
        spec=spec,
        system_links=(),
        etc_entries=(),
        binds=(),
        data_files=(),
        init_argv=("true",),
    )
    return build_argv(plan)


def _sized(argv: list[str]) -> dict[str, str]:
    """tmpfs destination -> the --size that precedes it (flags in between allowed)."""
    out: dict[str, str] = {}
    size: str | None = None
    for i, arg in enumerate(argv):
        if arg == "--size":
            size = argv[i + 1]
        elif arg == "--tmpfs":
            if size is not None:
                out[argv[i + 1]] = size
            size = None
    return out


def test_every_writable_tmpfs_is_sized() -> None:
    sized = _sized(_argv(Limits(disk_bytes=1 << 20)))
    assert sized == {p: str(1 << 20) for p in ("/dev/shm", "/tmp", "/home", "/var")}


def test_a_home_outside_home_is_sized_too() -> None:
    assert _sized(_argv(Limits(disk_bytes=4096), home="/root"))["/root"] == "4096"


def test_without_disk_nothing_is_sized() -> None:
    argv = _argv(Limits())
    assert "--size" not in argv and "/dev/shm" not in argv
