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
    # "Not tested" is not "met": every mandatory requirement must be met here,
    # except those listed with the reason they cannot be tested on this machine.
    untested = {
        r: f"{reqs[r]}: {reasons[r]}"
        for r in MANDATORY
        if reqs[r] != "met" and r not in MAY_BE_UNTESTED
    }
    assert not untested, untested


#: Mandatory requirements allowed to come back other than "met" on the
#: namespace backend, each with why. Keep this list short and explained.
MAY_BE_UNTESTED: dict[str, str] = {}


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
    # four hostint-verifier-* (browser-check hijack included), use-product-port,
    # hostint-run-planted-traps
    assert isinstance(probes, list) and len(probes) == 6
    assert all(p["verdict"] == "ok" for p in probes), _lines(report, "unexpected")


@pytest.mark.requires_sandbox
@pytest.mark.timeout(300)
def test_fast_path_meets_processes_privilege_and_secrets(tmp_path: Path) -> None:
    """The probes of three categories through the compiled front end and a launcher
    of the suite's own (issue 13: guarantees hold on the fast path). The front end
    runs with CORRAL_LAUNCHER=require, so a fallback to the Python CLI fails the
    preflight instead of passing for the fast path. The whole suite's run is in
    README's table; the kill -9 points of client, launcher and worker are
    tests/integration/sandbox/test_launcher.py."""
    report = _verify(
        tmp_path,
        "--backend",
        "fastpath",
        "--category",
        "processes",
        "--category",
        "privilege",
        "--category",
        "secrets",
        timeout=280,
    )
    reqs, reasons = report["requirements"], report["requirement_reasons"]
    assert isinstance(reqs, dict) and isinstance(reasons, dict)
    for r in ("M4", "M5", "M8"):
        assert reqs[r] == "met", (r, reasons[r], _lines(report, "unexpected"))
    assert report["_exit"] == 0


#: One probe per requirement the microVM guards from the host side, under TCG
#: (seconds each here): secrets, files, network, fail-closed with and without
#: the accepted degradation, a kernel buffer charged to the VM's cap.
_MICROVM_PROBES = (
    "secrets-env-anthropic-api-key",
    "files-read-home",
    "net-loopback-http",
    "failclosed-missing-layer",
    "failclosed-degraded-recorded",
    "fp-tcp-buffers",
)


@pytest.mark.requires_qemu
@pytest.mark.requires_root
@pytest.mark.timeout(600)
def test_microvm_under_tcg_meets_its_core_probes(tmp_path: Path) -> None:
    """`corral verify --backend microvm` on a probe of each of M1 M3 M4 M7 M10 (issue 12:
    the verify categories that apply, in CI). The whole suite under TCG takes over an hour
    here; its run is in README's table and the microVM section."""
    args = [a for p in _MICROVM_PROBES for a in ("--probe", p)]
    report = _verify(tmp_path, "--backend", "microvm", *args, timeout=580)
    probes = report["probes"]
    assert isinstance(probes, list)
    # `--probe` selects by prefix (files-read-home brings files-read-home-dir along).
    assert set(_MICROVM_PROBES) <= {p["id"] for p in probes}
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
    # use-product-port, the four hostint-verifier-* (browser-check hijack included)
    # and hostint-run-planted-traps.
    assert isinstance(not_run, list) and len(not_run) == 6
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


@pytest.mark.requires_sandbox
@pytest.mark.timeout(180)
def test_credential_probe_is_judged_when_real_credentials_exist(tmp_path: Path) -> None:
    """A developer with real ~/.aws/credentials, gh hosts.yml and .pypirc: the
    M4 probe is still judged (from a digest of the file on the host), the
    attack works without a sandbox, fails in one, and the file's content never
    appears in the report."""
    home = tmp_path / "home"
    real = {
        ".aws/credentials": "[default]\naws_secret_access_key = REALSECRET-aws-0f3c9a\n",
        ".config/gh/hosts.yml": "github.com:\n    oauth_token: REALSECRET-gh-77e1d2\n",
        ".pypirc": "[pypi]\npassword = REALSECRET-pypi-5b8e40\n",
    }
    for rel, body in real.items():
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        path.chmod(0o600)
    env = {**os.environ, "HOME": str(home)}
    results = {}
    for backend in ("none", "namespace"):
        out = tmp_path / f"{backend}.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "corral",
                "verify",
                "--json",
                str(out),
                "--no-netns",
                "--backend",
                backend,
                "--probe",
                "secrets-credential-files",
            ],
            capture_output=True,
            text=True,
            timeout=170,
            check=False,
            cwd=tmp_path,
            env=env,
        )
        assert out.exists(), proc.stderr[-2000:]
        text = out.read_text()
        assert "REALSECRET" not in text and "REALSECRET" not in proc.stdout + proc.stderr
        probes = json.loads(text)["probes"]
        assert [p["id"] for p in probes] == ["secrets-credential-files"], text[-2000:]
        results[backend] = probes[0]["observed"]
    assert results == {"none": "allowed", "namespace": "denied"}
    # The real files are left exactly as they were.
    assert {rel: (home / rel).read_text() for rel in real} == real


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
