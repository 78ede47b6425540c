"""Host facts a warm worker read ahead (`layers.prepare`) are never used once stale.

Each attack changes the cgroup mounts after `prepare` and before the request,
in a private mount namespace of a child process (the test's own mounts stay
as they are), and asserts the request's layer check sees the change.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.requires_root]

_PRELUDE = textwrap.dedent(
    """
    import ctypes, os, select, subprocess
    from corral.sandbox import layers
    from corral.sandbox.cgroup import detect_layout
    from corral.sandbox.namespace import NamespaceSandbox
    from corral.sandbox.spec import SandboxSpec

    def unmount_cgroups(layout):
        mounts = {m for _, m in layout.v1} | ({layout.unified} if layout.unified else set())
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], check=True)

    def private_mount_ns():
        if ctypes.CDLL(None, use_errno=True).unshare(0x00020000) != 0:  # CLONE_NEWNS
            raise OSError(ctypes.get_errno(), "unshare")
        subprocess.run(["mount", "--make-rprivate", "/"], check=True)

    def cgroup_reason():
        spec = SandboxSpec(argv=("true",), workspace="/", env=())
        return NamespaceSandbox(spec).check()["cgroup"]

    layers.prepare()
    prepared = layers.cgroup_layout()
    assert prepared is not None and prepared == detect_layout(), prepared
    # Served from what prepare read (no mount changed yet): the same object.
    assert layers.cgroup_layout() is prepared
    assert cgroup_reason() is None
    """
)


def _run(body: str) -> None:
    script = _PRELUDE + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok", proc.stdout


def test_an_unmount_after_prepare_is_seen_by_the_request() -> None:
    _run(
        """
        # Prepared again in the private namespace: the unmount is in prepare's own.
        private_mount_ns()
        layers.prepare()
        prepared = layers.cgroup_layout()
        assert layers.cgroup_layout() is prepared
        unmount_cgroups(prepared)
        fresh = detect_layout()
        assert fresh != prepared  # the prepared layout is stale now
        assert layers.cgroup_layout() == fresh
        assert layers.cgroup_layout() is not prepared
        assert cgroup_reason() == "no cgroup filesystem mounted", cgroup_reason()
        print("ok")
        """
    )


def test_a_change_in_another_mount_namespace_is_seen_by_the_request() -> None:
    _run(
        """
        # prepare's mountinfo descriptor watches the namespace it was opened in
        # and reports nothing about the one this process moves to: the request
        # must notice the move itself.
        fd = layers._mounts[0].fd
        private_mount_ns()
        unmount_cgroups(prepared)
        p = select.poll()
        p.register(fd, select.POLLPRI)
        assert not any(ev & (select.POLLPRI | select.POLLERR) for _, ev in p.poll(0))
        assert detect_layout() != prepared
        assert layers.cgroup_layout() == detect_layout()
        assert cgroup_reason() == "no cgroup filesystem mounted", cgroup_reason()
        print("ok")
        """
    )


def test_a_remount_after_prepare_is_seen_even_when_the_layout_is_the_same() -> None:
    _run(
        """
        # Any mount event drops what prepare read, even one that leaves the
        # layout equal: the descriptor cannot tell which change it was.
        private_mount_ns()
        layers.prepare()
        prepared = layers.cgroup_layout()
        subprocess.run(["mount", "-t", "tmpfs", "none", "/mnt"], check=True)
        again = layers.cgroup_layout()
        assert again == prepared and again is not prepared
        assert not layers._mounts
        print("ok")
        """
    )
