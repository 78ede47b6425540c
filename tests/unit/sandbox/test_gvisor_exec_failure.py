"""runsc's exit 128 told apart from a command's own 128, from runsc's log (pure)."""

from __future__ import annotations

import pytest

from corral.sandbox.gvisor.backend import exec_argv, exec_failure
from corral.sandbox.gvisor.bundle import runsc_argv
from corral.sandbox.gvisor.connect import FORWARDER, LISTENER, ExecTarget, forwarder_argv
from corral.sandbox.gvisor.ps import Located

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


def test_listen_relay_runs_as_another_uid_than_the_command() -> None:
    """The command must not be able to kill or ptrace the relay its listener depends on."""
    t = ExecTarget(runsc="/usr/bin/runsc", state_dir="/s", container_id="c", uid=1000, gid=1000)
    argv = forwarder_argv(t, 42, 3128, listen_to="10.200.0.1")
    assert argv[argv.index("--user") + 1] == "0:0"
    assert "--cap" not in argv
    assert argv[-2:] == ["3128", "10.200.0.1"]
    assert LISTENER in argv and FORWARDER not in argv


def test_command_exec_argv() -> None:
    target = Located(runsc="/usr/bin/runsc", state_dir="/s", container_id="c", holder=7)
    argv = exec_argv(target, 42, "/b/process.json", "/x/exec.log")
    assert argv[1:7] == ["-t", "42", "-n", "-p", "-m", "/usr/bin/runsc"]
    assert argv[-5:] == ["--log=/x/exec.log", "exec", "--process", "/b/process.json", "c"]


def test_exec_not_found_is_127() -> None:
    """The line `runsc exec --log` writes when the command does not exist (as seen here)."""
    log = (
        b'{"msg":"executing processes for container: executing command \\"/nonexist\\" in '
        b'sandbox: failed to load /nonexist: no such file or directory","level":"error",'
        b'"time":"2026-12-01T11:18:14.021715031Z"}\n'
    )
    assert exec_failure(log) == 127
