"""The pauses published for processes frozen with the run, and a helper's wait on them.

`publish_pauses` writes the record where the run's own processes read it
(`tools/pauses.json`); `file_paused_s` is their `paused_s`. The MCP gateway
(in its helper, frozen with the run) waits for its servers on that clock:
with the record saying "paused" it keeps waiting past its timeout; the
control, on the real clock, gives up.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from corral.broker.actions import Identity
from corral.broker.journal import Journal
from corral.broker.mcp_gateway import McpGateway
from corral.broker.mcp_policy import McpPolicy
from corral.errors import AgentError
from corral.pauseclock import Clock, PausableClock
from corral.run.environments import RunLayout
from corral.run.pause import file_paused_s, publish_pauses


def _layout(tmp_path: Path) -> RunLayout:
    layout = RunLayout(tmp_path / "run")
    layout.tools.mkdir(parents=True)
    return layout


def test_published_pauses_read_back_as_paused_seconds(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    publish_pauses(layout, lambda: [(10.0, 20.0), (30.0, None)])
    paused_s = file_paused_s(layout.pauses)
    assert paused_s(0.0, 25.0) == 10.0
    assert paused_s(15.0, 40.0) == 5.0 + 10.0  # the open pause runs to `now`
    assert oct(layout.pauses.stat().st_mode & 0o777) == "0o644"


def test_a_missing_or_broken_record_counts_nothing(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    assert file_paused_s(layout.pauses)(0.0, 100.0) == 0.0
    layout.pauses.write_text('[["x", 1]]')
    assert file_paused_s(layout.pauses)(0.0, 100.0) == 0.0


def test_nothing_is_published_without_a_tools_directory(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "gone")
    publish_pauses(layout, lambda: [(1.0, None)])
    assert not layout.pauses.exists()


def _wait_ready(tmp_path: Path, clock: Clock) -> None:
    with Journal(tmp_path / "journal.sqlite") as journal:
        gw = McpGateway(
            McpPolicy(), journal, Identity(run="r", session="1", env="agent"), scratch=tmp_path
        )
        # The servers answer after 1 s, as if the gateway had been frozen meanwhile.
        threading.Timer(1.0, gw._ready.set).start()
        try:
            gw.wait_ready(0.3, clock)
        finally:
            gw.close()


def test_the_gateway_waits_for_its_servers_while_the_run_is_paused(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    publish_pauses(layout, lambda: [(time.monotonic() - 1.0, None)])  # paused now
    started = time.monotonic()
    _wait_ready(tmp_path, PausableClock(file_paused_s(layout.pauses)))
    assert time.monotonic() - started >= 0.9


def test_control_on_the_real_clock_the_gateway_gives_up(tmp_path: Path) -> None:
    with pytest.raises(AgentError, match=r"did not start within 0\.3 s"):
        _wait_ready(tmp_path, time.monotonic)
