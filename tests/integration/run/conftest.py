"""After each run test, nothing of its runs may be left on the host, even when it failed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from corral.errors import CorralError
from corral.run.runcg import RunCgroup
from tests.integration.run.helpers import CREATED


@pytest.fixture(autouse=True)
def _sweep_runs() -> Iterator[None]:
    CREATED.clear()
    yield
    for rid in CREATED:
        cg = RunCgroup.detect(rid)
        if cg is not None and cg.exists():
            with contextlib.suppress(CorralError, OSError):
                cg.sweep()
    CREATED.clear()
