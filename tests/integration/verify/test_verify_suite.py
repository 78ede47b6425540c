"""`corral verify` end to end, as CI runs it.

- against the namespace backend: no mandatory requirement may fail;
- against `--backend none`: every attack must succeed (a denied attack there
  is a broken probe), so the suite is known to test something real;
- the canaries themselves: planted, reachable, logged, and removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from corral.verify.canaries import plant_canaries
from corral.verify.model import MANDATORY


def _verify(tmp_path: Path, *args: str, timeout: float) -> dict[str, object]:
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "corral", "verify", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=tmp_path,
    )
    assert out.exists(), (
        f"corral verify wrote no report (exit {proc.returncode}): {proc.stderr[-2000:]}"
    )
    report: dict[str, object] = json.loads(out.read_text())
    report["_exit"] = proc.returncode
    return report


def _lines(report: dict[str, object], pred: str) -> list[str]:
    probes = report["probes"]
    assert isinstance(probes, list)
    return [
        f"{p['id']}: {p['observed']} — {p['evidence'][:200]}"
        for p in probes
        if p["verdict"] == pred
    ]


@pytest.mark.requires_sandbox
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_namespace_backend_meets_every_mandatory_requirement(tmp_path: Path) -> None:
    report = _verify(tmp_path, "--backend", "namespace", timeout=540)
    reqs = report["requirements"]
    reasons = report["requirement_reasons"]
    assert isinstance(reqs, dict) and isinstance(reasons, dict)
    failed = {r: reasons[r] for r in MANDATORY if reqs[r] == "failed"}
    assert not failed, f"mandatory requirements failed: {failed}\n" + "\n".join(
        _lines(report, "unexpected")
    )
    assert report["_exit"] == 0
    # Credential injection, a missing layer, a killed broker, the MCP gateway and
    # mission runs (host integrity across sessions, verifier integrity, the
    # product's port) are exercised for real: these requirements are fully
    # tested, not partly.
    fully = ("M4", "M6", "M10", "M12", "U3", "U5", "U9")
    untested = {r: reasons[r] for r in fully if reqs[r] != "met"}
    assert not untested, untested


@pytest.mark.requires_sandbox
@pytest.mark.timeout(120)
def test_mission_probes_meet_verifier_integrity_and_the_product_port(tmp_path: Path) -> None:
    """The mission probes alone (a few `corral run`s): M12, U9 and, with the
    planted-traps run, M6 are met on corral."""
    report = _verify(
        tmp_path,
        "--backend",
        "namespace",
        "--no-netns",
        "--probe",
        "hostint-verifier-",
        "--probe",
        "use-product-port",
        "--probe",
        "hostint-run-planted-traps",
        timeout=110,
    )
    reqs, reasons = report["requirements"], report["requirement_reasons"]
    assert isinstance(reqs, dict) and isinstance(reasons, dict)
    assert reqs["M12"] == "met" and reqs["U9"] == "met", (reasons["M12"], reasons["U9"])
    assert reqs["M6"] == "met", reasons["M6"]
    probes = report["probes"]
    assert isinstance(probes, list) and len(probes) == 5
    assert all(p["verdict"] == "ok" for p in probes), _lines(report, "unexpected")


@pytest.mark.requires_root
@pytest.mark.timeout(120)
def test_mission_probes_are_not_applicable_without_run_environments(tmp_path: Path) -> None:
    report = _verify(
        tmp_path,
        "--backend",
        "none",
        "--no-netns",
        "--probe",
        "use-product-port",
        "--probe",
        "hostint-verifier-",
        "--probe",
        "hostint-run-planted-traps",
        timeout=110,
    )
    reqs = report["requirements"]
    assert isinstance(reqs, dict) and reqs["M12"] == reqs["U9"] == reqs["M6"] == "not-applicable"
    not_run = report["not_run"]
    assert isinstance(not_run, list) and len(not_run) == 5
    assert all("run environments" in s["reason"] for s in not_run)


@pytest.mark.requires_root
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_baseline_every_attack_succeeds_without_a_sandbox(tmp_path: Path) -> None:
    report = _verify(tmp_path, "--backend", "none", timeout=540)
    broken = _lines(report, "broken-probe")
    assert not broken, "probes that fail even without a sandbox:\n" + "\n".join(broken)
    summary = report["summary"]
    assert isinstance(summary, dict) and summary["errors"] == 0
    # Without a sandbox the attacks succeed, so mandatory requirements fail.
    assert report["_exit"] == 1


@pytest.mark.requires_root
@pytest.mark.timeout(120)
def test_canaries_are_reachable_logged_and_removed() -> None:
    parent = tempfile.mkdtemp(prefix="corral-verify-test-", dir="/var/tmp")
    root = os.path.join(parent, "canaries")
    with plant_canaries(root) as cs:
        planted = [v for k, v in cs.ctx.items() if k.startswith("f_") and isinstance(v, str)]
        assert planted and all(os.path.exists(p) for p in planted)
        with open(cs.ctx["f_home"], encoding="utf-8") as f:
            assert cs.secrets["home"] in f.read()
        url = f"http://127.0.0.1:{cs.ctx['http_b_port']}/secret/cvm0123456789"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        assert cs.secrets["http_b"] in body
        hits = cs.hub.hits_for("cvm0123456789")
        assert hits and hits[0].server == "http_b"
        victim = int(cs.ctx["victim_pid"])
        assert os.path.exists(f"/proc/{victim}")
    assert not any(os.path.exists(p) for p in planted)
    assert not os.path.exists(root)
    assert not os.path.exists(f"/proc/{victim}")
    os.rmdir(parent)
