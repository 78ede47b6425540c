"""footprint.svg from the watchdog's samples; matplotlib only when rendering."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from corral.run.plot import footprint_section
from corral.run.watchdog import EnvSample, Sample


def test_the_report_section_links_an_svg_with_the_caps(tmp_path: Path) -> None:
    lines = [
        Sample(
            float(i),
            float(i),
            1 << 33,
            {},
            {
                "run": EnvSample((20 + i) << 20, i * 0.5),
                "agent": EnvSample((10 + i) << 20, i * 0.4),
            },
        ).to_json()
        for i in range(5)
    ]
    (tmp_path / "footprint.jsonl").write_text("\n".join(lines) + "\nnot json\n")
    section = footprint_section(tmp_path, {"run": 64 << 20, "agent": 32 << 20})
    assert "](footprint.svg)" in section
    svg = (tmp_path / "footprint.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    # Both caps are drawn (their legend entries).
    assert "run cap" in svg and "agent cap" in svg
    assert footprint_section(tmp_path / "none", {}) == ""


def test_matplotlib_stays_off_the_exec_and_coordinator_import_path() -> None:
    code = (
        "import sys, corral.exec.cli, corral.run.coordinator, corral.run.watchdog;"
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_disk_samples_get_a_panel_with_the_quota(tmp_path: Path) -> None:
    lines = [
        Sample(
            float(i),
            float(i),
            1 << 33,
            {},
            {"run": EnvSample(20 << 20, i * 0.5)},
            disk_bytes=(i * 10) << 20,
            disk_cap_bytes=64 << 20,
        ).to_json()
        for i in range(5)
    ]
    (tmp_path / "footprint.jsonl").write_text("\n".join(lines) + "\n")
    section = footprint_section(tmp_path, {"run": 64 << 20})
    assert "memory, CPU and disk" in section
    svg = (tmp_path / "footprint.svg").read_text()
    assert "disk cap" in svg and "run disk" in svg
