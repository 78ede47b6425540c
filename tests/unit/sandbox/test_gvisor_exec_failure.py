"""runsc's exit 128 told apart from a command's own 128, from runsc's log (pure)."""

from __future__ import annotations

import pytest

from corral.sandbox.gvisor.backend import exec_failure
from corral.sandbox.gvisor.bundle import runsc_argv
from corral.sandbox.gvisor.connect import ExecTarget, forwarder_argv

_PFX = b"running container: starting container: starting root container: starting sandbox: "


@pytest.mark.parametrize(
    ("log", "code"),
    [
        (
            _PFX
            + b'error finding executable "x" in PATH [/usr/bin /bin]: no such file or directory',
            127,
        ),
        (_PFX + b"creating process: failed to load /nonexist/x: no such file or directory", 127),
        (_PFX + b"creating process: failed to load /etc/passwd: permission denied", 126),
        (b"", None),
        (b'{"msg":"some other runsc error","level":"error"}', None),
    ],
)
def test_exec_failure(log: bytes, code: int | None) -> None:
    assert exec_failure(log) == code


def test_log_flag_only_when_asked() -> None:
    base = dict(runsc="runsc", platform="ptrace", state_dir="/s", bundle_dir="/b", container_id="c")
    assert not any(a.startswith("--log") for a in runsc_argv(**base))  # type: ignore[arg-type]
    argv = runsc_argv(**base, log_file="/s/runsc.log")  # type: ignore[arg-type]
    assert argv.index("--log=/s/runsc.log") < argv.index("run")


def test_forwarder_runs_as_the_command_in_its_namespaces() -> None:
    t = ExecTarget(runsc="/usr/bin/runsc", state_dir="/s", container_id="c", uid=1000, gid=1000)
    argv = forwarder_argv(t, 42, 8080)
    assert argv[:7] == ["nsenter", "-t", "42", "-n", "-p", "-m", "/usr/bin/runsc"]
    assert argv[argv.index("--user") + 1] == "1000:1000"
    assert "--cap" not in argv
    assert argv[-1] == "8080"
