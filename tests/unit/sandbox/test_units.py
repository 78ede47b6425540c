from __future__ import annotations

import pytest

from corral.errors import UsageError
from corral.sandbox.units import format_size, parse_cpus, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("512M", 512 << 20),
        ("512m", 512 << 20),
        ("2G", 2 << 30),
        ("1.5GiB", 3 << 29),
        ("64k", 64 << 10),
        ("1T", 1 << 40),
        ("100MB", 100 << 20),
        (" 8 M ", 8 << 20),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1M", "0", "1.2.3G", "5X", "M", "12ib"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("600", 600.0), ("30s", 30.0), ("1.5m", 90.0), ("2h", 7200.0), ("250ms", 0.25)],
)
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "soon", "0", "-5", "10d", "inf", "nan"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_duration(text)


def test_parse_cpus() -> None:
    assert parse_cpus("0.5") == 0.5
    assert parse_cpus("2") == 2.0
    for bad in ("0", "-1", "x", "inf", "nan", "5000"):
        with pytest.raises(UsageError):
            parse_cpus(bad)


def test_format_size() -> None:
    assert format_size(512 << 20) == "512M"
    assert format_size(2 << 30) == "2G"
    assert format_size(1000) == "1000"
