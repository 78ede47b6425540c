"""gVisor: the container's own process runs the command (no network hook) and the
command sees what `runsc exec` gave it: exactly the spec's environment, its argv."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from corral.sandbox.backend import GVisorConfig, SandboxNet
from corral.sandbox.gvisor import preboot
from tests.conformance.helpers import run, spec

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]

_DUMP = "import os, sys; open('out', 'w').write(repr((sorted(os.environ.items()), sys.argv[1:])))"


def _no_hook(_net: SandboxNet) -> None:
    pass


@pytest.mark.parametrize(
    "hook", [None, _no_hook, "preboot"], ids=["supervisor", "holder", "preboot"]
)
@pytest.mark.parametrize(
    "extra", [(), (("IFS", ":"), ("PWD", "/x y;$(id)"))], ids=["plain", "pwd-ifs"]
)
def test_the_command_gets_exactly_the_spec_environment(
    hook: object, extra: tuple[tuple[str, str], ...], tmp_path: Path
) -> None:
    s = spec(tmp_path, "/usr/bin/python3", "-I", "-S", "-c", _DUMP, "a b", "$0")
    s = dataclasses.replace(s, env=tuple(sorted((*s.env, *extra))))
    if hook == "preboot":
        key = preboot.boot_key(s, GVisorConfig(), "corral")
        assert key is not None
        preboot.prepare(key)
    result = run(GVisorConfig().load(), s, network=_no_hook if hook is _no_hook else None)
    assert (result.exit, result.reason) == (0, "exited")
    assert ("preboot" in result.layers) == (hook == "preboot")
    env, argv = ast.literal_eval((tmp_path / "out").read_text())
    if hook is _no_hook:  # the broker link's proxy variables (gvisor.net) are the holder path's own
        env = [(k, v) for k, v in env if not k.lower().endswith("_proxy")]
    assert env == sorted(s.env)
    assert argv == ["a b", "$0"]
