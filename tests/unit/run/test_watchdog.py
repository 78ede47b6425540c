"""The watchdog's pure half: parsing the kernel's files and deciding a breach."""

from __future__ import annotations

import pytest

from corral.errors import ConfigError
from corral.run.mission import WatchSettings, parse_mission
from corral.run.watchdog import (
    EnvSample,
    Sample,
    breach,
    parse_mem_available,
    parse_pressure,
)

MEMINFO = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:    2000000 kB\n"
PSI = (
    "some avg10=41.50 avg60=3.00 avg300=0.10 total=1\n"
    "full avg10=1.00 avg60=0.00 avg300=0.00 total=2\n"
)


def _sample(available: int, pressure: dict[str, float] | None = None) -> Sample:
    return Sample(0.0, 0.0, available, pressure or {}, {"run": EnvSample(1, 0.5)})


def test_kernel_files_parse() -> None:
    assert parse_mem_available(MEMINFO) == 2000000 * 1024
    p = parse_pressure(PSI)
    assert p["some avg10"] == 41.5 and p["full avg60"] == 0.0 and "some total" not in p
    with pytest.raises(ValueError):
        parse_mem_available("MemTotal: 1 kB\n")


def test_breach_on_host_memory_and_on_pressure() -> None:
    w = WatchSettings(host_memory_min_free=1 << 30, memory_pressure="some avg10 > 40")
    low = breach(w, _sample(512 << 20))
    assert low is not None and low.what == "host_memory_min_free"
    assert (low.value, low.threshold) == (512 << 20, 1 << 30)
    hot = breach(w, _sample(4 << 30, parse_pressure(PSI)))
    assert hot is not None and (hot.what, hot.value, hot.threshold) == ("memory_pressure", 41.5, 40)
    assert breach(w, _sample(4 << 30, {"some avg10": 39.0})) is None
    assert breach(WatchSettings(), _sample(1)) is None


def _mission(watch: str) -> str:
    return f'+++\n[watch]\n{watch}\n\n[[checks]]\nname = "c"\nrun = "true"\n+++\n# m\n'


def test_mission_watch_section() -> None:
    m = parse_mission(_mission('host_memory_min_free = "1G"\non_breach = "kill"'), "m.md")
    assert m.settings.watch.host_memory_min_free == 1 << 30
    assert m.settings.watch.on_breach == "kill" and m.settings.watch.interval <= 0.1
    for bad in ('on_breach = "ignore"', 'memory_pressure = "avg10 > x"', "interval = 1.0"):
        with pytest.raises(ConfigError):
            parse_mission(_mission(bad), "m.md")
