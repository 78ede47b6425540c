"""The control server: journaled first, then effective; a failed journal changes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.broker.actions import Identity, Observation
from corral.broker.config import BrokerConfig
from corral.broker.control import ControlServer, bind_control_socket, request
from corral.broker.journal import GroupCommitJournal, Journal, read_rows
from corral.broker.livepolicy import parse_rule
from corral.errors import BrokerError, JournalError


class _Recording(GroupCommitJournal):
    """A real journal that logs the order of events, or fails every append."""

    def __init__(self, journal: Journal, events: list[str], fail: bool) -> None:
        super().__init__(journal)
        self.events = events
        self.fail = fail

    async def append(self, obs: Observation) -> int:
        if self.fail:
            raise JournalError("disk full")
        n = await super().append(obs)
        self.events.append(f"journaled {obs.kind}")
        return n


def _serve(tmp_path: Path, fail: bool) -> tuple[list[str], dict[str, object], BrokerConfig]:
    events: list[str] = []
    applied: list[BrokerConfig] = []
    path = tmp_path / "control" / "c.sock"
    rule = parse_rule("pypi.org:443").model_dump(mode="json")

    def apply(config: BrokerConfig) -> None:
        events.append("applied")
        applied.append(config)

    async def main() -> dict[str, object]:
        with Journal(tmp_path / "j.sqlite") as j:
            server = ControlServer(
                bind_control_socket(path),
                path,
                config=BrokerConfig(),
                apply=apply,
                journal=_Recording(j, events, fail),
                identity=Identity(run="r", session="s"),
                journal_path=tmp_path / "j.sqlite",
            )
            await server.start()
            try:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(
                    None, request, path, {"op": "add_rule", "rule": rule}
                )
            finally:
                await server.aclose()

    answer = asyncio.run(main())
    assert not path.exists()
    return events, answer, applied[0] if applied else BrokerConfig()


def test_the_row_is_committed_before_the_rule_applies(tmp_path: Path) -> None:
    events, answer, config = _serve(tmp_path, fail=False)
    assert answer["ok"] is True
    assert events == ["journaled policy", "applied"]
    assert [r.host for r in config.rules] == ["pypi.org"]
    [row] = read_rows(tmp_path / "j.sqlite", kind="policy")
    assert row.detail["rule"]["host"] == "pypi.org" and row.run == "r" and row.session == "s"


def test_a_journal_that_fails_leaves_the_policy_as_it_was(tmp_path: Path) -> None:
    events, answer, _ = _serve(tmp_path, fail=True)
    assert answer["ok"] is False and "disk full" in str(answer["error"])
    assert events == []


def test_a_control_directory_open_to_others_refuses(tmp_path: Path) -> None:
    d = tmp_path / "control"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    with pytest.raises(BrokerError, match="mode 0700"):
        bind_control_socket(d / "c.sock")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(BrokerError):
        bind_control_socket(link / "c.sock")
