"""The broker's pause-aware loop clock: parsing, the cheap file cache, `time()` (issue 10)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from corral.broker.config import BrokerConfig
from corral.broker.pauseloop import (
    MAX_PAUSES,
    MAX_PAUSES_BYTES,
    PausableEventLoop,
    PauseFile,
    loop_factory,
    parse_pauses,
)
from corral.errors import ConfigError
from corral.run.pause import pauses_json


def test_parse_reads_what_corral_writes() -> None:
    text = pauses_json([(10.0, 12.5), (20.0, None)])
    assert parse_pauses(text.encode()) == ((10.0, 12.5), (20.0, None))
    assert parse_pauses(b"[]") == ()


@pytest.mark.parametrize(
    "data",
    [
        b"{}",
        b"[[1.0]]",
        b"[[1.0, 2.0, 3.0]]",
        b'[["1", 2.0]]',
        b"[[true, 2.0]]",
        b"[[1.0, NaN]]",
        b"[[1.0, Infinity]]",
        b"[[2.0, 1.0]]",
        b"[[1.0, null], [3.0, 4.0]]",
        b"not json",
        json.dumps([[1.0, 2.0]] * (MAX_PAUSES + 1)).encode(),
        b" " * MAX_PAUSES_BYTES + b"[]",
    ],
)
def test_parse_refuses_anything_else(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_pauses(data)


class _Fs:
    """A pauses file in memory, counting the broker's looks and reads."""

    def __init__(self, data: bytes | None) -> None:
        self.data = data
        self.version = 0
        self.stats = 0
        self.reads = 0

    def write(self, data: bytes | None) -> None:
        self.data = data
        self.version += 1

    def stat(self, _path: Path) -> os.stat_result:
        self.stats += 1
        if self.data is None:
            raise FileNotFoundError(2, "no pauses")
        return os.stat_result((0o100644, self.version, 1, 1, 0, 0, len(self.data), 0, 0, 0))

    def read(self, _path: Path) -> bytes:
        self.reads += 1
        if self.data is None:
            raise FileNotFoundError(2, "no pauses")
        return self.data


def _file(fs: _Fs) -> PauseFile:
    return PauseFile(Path("/run/x/tools/pauses.json"), recheck_s=0.05, look=fs.stat, read=fs.read)


def test_no_file_no_pause() -> None:
    fs = _Fs(None)
    assert _file(fs).paused_s(0.0, 100.0) == 0.0


def test_an_open_pause_counts_up_to_now_and_a_closed_one_its_length() -> None:
    fs = _Fs(b"[[10.0, null]]")
    pauses = _file(fs)
    assert pauses.paused_s(0.0, 10.0) == 0.0
    assert pauses.paused_s(0.0, 15.0) == 5.0
    fs.write(b"[[10.0, 16.0]]")
    assert pauses.paused_s(0.0, 30.0) == 6.0
    # Only what lies after `since` counts.
    assert pauses.paused_s(12.0, 30.0) == 4.0
    assert pauses.paused_s(20.0, 30.0) == 0.0


def test_the_file_is_looked_at_at_most_every_recheck_and_read_only_when_changed() -> None:
    fs = _Fs(b"[[10.0, 11.0]]")
    pauses = _file(fs)
    for i in range(100):
        pauses.paused_s(0.0, 20.0 + i * 0.001)  # 100 readings within 0.1 s
    assert fs.stats <= 3 and fs.reads == 1
    for i in range(100):
        pauses.paused_s(0.0, 21.0 + i * 0.1)  # each reading a look, none a read
    assert fs.stats >= 100 and fs.reads == 1
    fs.write(b"[[10.0, 11.0], [40.0, 42.0]]")
    assert pauses.paused_s(0.0, 50.0) == 3.0
    assert fs.reads == 2


def test_a_change_is_seen_within_one_recheck() -> None:
    fs = _Fs(b"[]")
    pauses = _file(fs)
    assert pauses.paused_s(0.0, 10.0) == 0.0
    fs.write(b"[[10.0, null]]")
    assert pauses.paused_s(0.0, 10.01) == 0.0  # not looked at yet: at most 10 ms stale
    assert pauses.paused_s(0.0, 10.06) == pytest.approx(0.06)


@pytest.mark.parametrize("bad", [None, b"garbage", b"[[1.0, null], [2.0, 3.0]]"])
def test_an_unreadable_or_foreign_file_keeps_the_last_good_reading(bad: bytes | None) -> None:
    fs = _Fs(b"[[10.0, 20.0]]")
    pauses = _file(fs)
    assert pauses.paused_s(0.0, 30.0) == 10.0
    fs.write(bad)
    # Dropping the 10 s would jump the clock forward and fire every timer.
    assert pauses.paused_s(0.0, 31.0) == 10.0
    fs.write(b"[[10.0, 20.0], [35.0, 36.0]]")
    assert pauses.paused_s(0.0, 40.0) == 11.0


def test_the_loop_time_stands_still_while_paused_and_runs_on_after(tmp_path: Path) -> None:
    path = tmp_path / "pauses.json"
    now = [100.0]
    loop = PausableEventLoop(PauseFile(path, recheck_s=0.0), now=lambda: now[0])
    try:
        t0 = loop.time()
        now[0] = 101.0
        assert loop.time() == t0 + 1.0
        path.write_text(pauses_json([(101.5, None)]))
        now[0] = 700.0  # frozen for ten minutes
        assert loop.time() == t0 + 1.5
        path.write_text(pauses_json([(101.5, 700.0)]))
        now[0] = 702.0
        assert loop.time() == t0 + 3.5
        # Never backwards, whatever the file says.
        path.write_text(pauses_json([(0.0, 700.0)]))
        now[0] = 703.0
        assert loop.time() == t0 + 3.5
    finally:
        loop.close()


def test_an_asyncio_timeout_still_fires_on_the_pausable_loop(tmp_path: Path) -> None:
    async def main() -> bool:
        try:
            async with asyncio.timeout(0.05):
                await asyncio.sleep(10)
        except TimeoutError:
            return True
        return False

    with asyncio.Runner(loop_factory=loop_factory(str(tmp_path / "pauses.json"))) as runner:
        assert isinstance(runner.get_loop(), PausableEventLoop)
        assert runner.run(main())


def test_a_fifo_or_symlink_in_place_of_the_file_is_not_waited_on(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(pauses_json([(10.0, 20.0)]))
    fifo = tmp_path / "pauses.json"
    os.mkfifo(fifo)
    pauses = PauseFile(fifo, recheck_s=0.0)
    assert pauses.paused_s(0.0, 30.0) == 0.0  # returned: nobody ever writes the FIFO
    fifo.unlink()
    fifo.symlink_to(good)
    assert pauses.paused_s(0.0, 30.0) == 0.0
    os.replace(good, fifo)
    assert pauses.paused_s(0.0, 30.0) == 10.0


def test_no_pauses_file_no_pausable_loop() -> None:
    assert loop_factory(None) is None


def test_the_config_takes_an_absolute_pauses_path_only() -> None:
    config = BrokerConfig.model_validate({"pauses": "/runs/r1/tools/pauses.json"})
    assert BrokerConfig.from_json(config.to_json()).pauses == "/runs/r1/tools/pauses.json"
    assert BrokerConfig().pauses is None
    with pytest.raises(ConfigError):
        BrokerConfig.from_json(json.dumps({"pauses": "tools/pauses.json"}))
