from __future__ import annotations

import json

from corral.sandbox import landlock
from corral.sandbox.namespace import init_command, landlock_rules_for
from corral.sandbox.spec import SandboxSpec

SPEC = SandboxSpec(argv=("echo", "hi"), workspace="/work/p", env=())


def test_compiled_init_gets_the_plan_as_numbers() -> None:
    argv, files, binds = init_command(SPEC, binary="/cache/corral-init-1", abi=7, status_fd=9)
    assert argv[:2] == ("/run/corral/init", "9")
    assert argv[-3:] == ("--", "echo", "hi")
    assert files == []
    assert binds == (("/cache/corral-init-1", "/run/corral/init"),)
    plan = landlock.plan(landlock.LandlockRules.from_dict(landlock_rules_for(SPEC)), 7)
    i = argv.index("--ll")
    assert argv[i + 1 : i + 6] == tuple(
        str(v)
        for v in (plan.abi, plan.handled_fs, plan.handled_net, plan.scoped, plan.restrict_flags)
    )
    paths = [(argv[j + 2], int(argv[j + 1])) for j, a in enumerate(argv) if a == "--path"]
    assert paths == [(p, m) for p, m in plan.paths]
    assert ("/work/p", plan.handled_fs) in paths


def test_compiled_init_without_landlock() -> None:
    argv, _, _ = init_command(SPEC, binary="/b", abi=0, status_fd=3)
    assert argv == ("/run/corral/init", "3", "--", "echo", "hi")


def test_python_init_gets_json_and_modules() -> None:
    argv, files, binds = init_command(SPEC, binary=None, abi=7, status_fd=4)
    assert argv[:5] == ("/usr/bin/python3", "-I", "-S", "/run/corral/init.py", "4")
    assert json.loads(argv[5]) == landlock_rules_for(SPEC)
    assert [d for d, _ in files] == ["/run/corral/init.py", "/run/corral/landlock.py"]
    assert binds == ()


def test_dev_is_read_only_but_devices_writable() -> None:
    rules = landlock_rules_for(SPEC)
    assert "/dev" in rules["read_only"]  # type: ignore[operator]
    assert "/dev/null" in rules["read_write"]  # type: ignore[operator]
    assert "/dev" not in rules["read_write"]  # type: ignore[operator]


def test_hold_fd_reaches_both_inits() -> None:
    argv, _, _ = init_command(SPEC, binary="/b", abi=0, status_fd=3, hold_fd=5)
    assert argv == ("/run/corral/init", "3", "--hold", "5", "--", "echo", "hi")
    argv, _, _ = init_command(SPEC, binary=None, abi=0, status_fd=3, hold_fd=5)
    assert argv[4:] == ("3", "-", "--hold", "5", "--", "echo", "hi")
