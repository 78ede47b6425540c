"""gVisor: the command's output goes where the caller pointed it, even after the caller
closed its own descriptor (as `corral run` does once the sandbox started).

The attack: the command's output reaching a host file it was never given. A
relay that copied to the caller's descriptor *number* wrote, once the caller
had closed it, into whatever file next took that number (here a stand-in
for a journal); the agent's output log stayed empty.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.sandbox.backend import GVisorConfig
from tests.conformance.helpers import spec

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]


def test_output_reaches_the_given_pipe_not_a_file_that_reused_its_number(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    r, w = os.pipe2(os.O_CLOEXEC)
    victim = tmp_path / "journal"
    cmd = "sleep 1; echo corral-out-MARK; echo corral-err-MARK >&2"
    sb = GVisorConfig().load().start(spec(ws, "/bin/sh", "-c", cmd), stdio=(None, w, w))
    try:
        number = w
        os.close(w)
        # The freed number is given to another file, as the next open() would
        # if no lower number were free (placed explicitly: other threads of the
        # test process may free lower ones).
        opened = os.open(victim, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if opened == number:
            fd = opened
        else:
            fd = os.dup2(opened, number, inheritable=False)
            os.close(opened)
        try:
            assert fd == number
            result = sb.wait(60)
        finally:
            os.close(fd)
    finally:
        sb.close()
    assert result.exit == 0
    assert victim.read_bytes() == b"", "the command's output landed in another host file"
    os.set_blocking(r, False)
    try:
        got = os.read(r, 4096)
    finally:
        os.close(r)
    assert b"corral-out-MARK" in got and b"corral-err-MARK" in got, got
