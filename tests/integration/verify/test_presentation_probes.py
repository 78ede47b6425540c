"""The M13 mission probes through `corral verify`: met on namespace, not applicable on none.

Against corral's unescaped displays and its str-based host git (the code before
issue 9's items 7 and 8) both probes observe the attack: `corral log` exits 1
with rich's MarkupError, and session 1 is never committed (UnicodeEncodeError).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.verify.test_verify_suite import _lines, _verify


@pytest.mark.requires_sandbox
@pytest.mark.timeout(120)
def test_presentation_probes_meet_m13_on_namespace(tmp_path: Path) -> None:
    report = _verify(
        tmp_path, "--backend", "namespace", "--no-netns", "--probe", "present-run-", timeout=110
    )
    reqs, reasons = report["requirements"], report["requirement_reasons"]
    assert isinstance(reqs, dict) and isinstance(reasons, dict)
    assert reqs["M13"] == "met", reasons["M13"]
    probes = report["probes"]
    assert isinstance(probes, list) and len(probes) == 2
    assert all(p["verdict"] == "ok" for p in probes), _lines(report, "unexpected")


@pytest.mark.requires_root
@pytest.mark.timeout(120)
def test_presentation_probes_are_not_applicable_on_none(tmp_path: Path) -> None:
    report = _verify(
        tmp_path, "--backend", "none", "--no-netns", "--probe", "present-run-", timeout=110
    )
    reqs = report["requirements"]
    assert isinstance(reqs, dict) and reqs["M13"] == "not-applicable"
    not_run = report["not_run"]
    assert isinstance(not_run, list) and len(not_run) == 2
    assert all("run environments" in s["reason"] for s in not_run)
