"""The cgroup primer's no-op re-attach leaves the process where it was (host side)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.sandbox import cgprime
from corral.sandbox.cgroup import detect_layout

pytestmark = [pytest.mark.requires_root]


def test_the_primer_moves_nothing() -> None:
    layout = detect_layout()
    assert layout is not None
    before = Path("/proc/self/cgroup").read_text()
    thread = cgprime.start(layout)
    assert thread is not None
    thread.join(30)
    assert not thread.is_alive()
    assert Path("/proc/self/cgroup").read_text() == before
