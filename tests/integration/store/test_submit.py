"""`corral submit` with what `corral run` takes: `--provider-key`, and `limits.run_disk`."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from corral.run.rundisk import is_mounted
from corral.store.postgres import PgFleet
from corral.store.worker import run_dir
from tests.integration.run.helpers import corral, corral_argv, new_id, wait_for, write_mission

pytestmark = [pytest.mark.requires_postgresql]

_NO_SCENARIO = """+++
agent = "script"
max_sessions = 1
[[checks]]
name = "file"
run = "test -f done.txt"
+++
Write done.txt.
"""


def _frozen(pg_url: str, rid: str, name: str) -> bytes:
    with PgFleet(pg_url) as f:
        files, _ = f.files(rid)
    with tarfile.open(fileobj=io.BytesIO(files), mode="r:gz") as tar:
        member = tar.extractfile(name)
        assert member is not None
        return member.read()


def test_submit_passes_provider_and_key_like_run(tmp_path: Path, pg_url: str) -> None:
    (tmp_path / "MISSION.md").write_text(_NO_SCENARIO, encoding="utf-8")
    args = ("--provider", "anthropic-compatible:http://127.0.0.1:9", "--provider-key")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    # A key the environment lacks refuses the run before anything is queued.
    r = corral(
        "submit", "MISSION.md", "--store", pg_url, *args, "env:STORE2_KEY", cwd=tmp_path, env=env
    )
    assert r.returncode == 2 and "STORE2_KEY" in r.stderr, r.stderr
    with PgFleet(pg_url) as f:
        assert f.runs() == []
    env["STORE2_KEY"] = "k-secret-123"
    r = corral(
        "submit",
        "MISSION.md",
        "--store",
        pg_url,
        *args,
        "env:STORE2_KEY",
        "--id",
        "rk",
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    cfg = json.loads(_frozen(pg_url, "rk", "run.json"))
    assert (cfg["provider"], cfg["provider_key"]) == (
        "anthropic-compatible:http://127.0.0.1:9",
        "env:STORE2_KEY",
    )
    with PgFleet(pg_url) as f:
        files, _ = f.files("rk")
    assert b"k-secret-123" not in files  # the key's name travels, never its value


@pytest.mark.requires_sandbox
@pytest.mark.requires_root
def test_submitted_run_disk_is_made_and_dropped_by_the_worker(tmp_path: Path, pg_url: str) -> None:
    mission = write_mission(tmp_path / "m", agent_sleep=2)
    text = mission.read_text().replace('run_memory = "1G"', 'run_memory = "1G"\nrun_disk = "64M"')
    mission.write_text(text)
    rid = new_id()
    r = corral("submit", str(mission), "--store", pg_url, "--id", rid, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert b"run_disk" in _frozen(pg_url, rid, "mission.md")
    work = tmp_path / "w"
    root = run_dir(work, rid, 1)
    argv = corral_argv(
        "worker", "--store", pg_url, "--plain", "--max-runs", "1", "--work-dir", str(work)
    )
    w = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # The worker drives the run on the image it made on this host.
        wait_for(lambda: is_mounted(root), 120, "the run directory on its own image")
        assert (root.parent / ".disks" / f"{rid}.img").stat().st_size == 64 << 20
        out, _ = w.communicate(timeout=240)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    assert f"run {rid} passed".encode() in out, out[-2000:]
    # The run lives in the store: the worker's image is unmounted and deleted.
    assert not is_mounted(root)
    assert not (root.parent / ".disks" / f"{rid}.img").exists()
