"""issue 10: `run_disk` puts a run's directory on an ext4 image; a disk-filling agent
gets ENOSPC there and the host filesystem pays at most the quota."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.run.rundisk import is_mounted, reserve_bytes, sweep_stale
from corral.run.store import Store
from corral.run.watchdog import read_samples
from tests.integration.run.helpers import corral, new_id, write_mission

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_root, pytest.mark.timeout(90)]

MIB = 1 << 20
QUOTA = 64 * MIB


@pytest.fixture
def host_fs(tmp_path: Path) -> Iterator[Path]:
    """A filesystem of our own standing in for the host's: statvfs then sees
    only this test's writes, not those of whatever else the host runs."""
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=768m,mode=0700", "tmpfs", str(fs)], check=True
    )
    try:
        yield fs
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.mark.parametrize("source", ["/dev/zero", "/dev/urandom"])
def test_disk_filling_agent_gets_enospc_and_the_run_still_records_its_end(
    tmp_path: Path, host_fs: Path, source: str
) -> None:
    # /dev/urandom: host git cannot compress the agent's file, so committing
    # it needs as much again; it must fail without taking corral's reserve.
    mission = write_mission(tmp_path / "m")
    text = mission.read_text().replace('run_memory = "1G"', 'run_memory = "1G"\nrun_disk = "64M"')
    mission.write_text(text)
    scenario = tmp_path / "m" / "scenario.yaml"
    scenario.write_text(
        scenario.read_text().replace(
            "sleep 0; echo one > stage1",
            f"head -c 300M {source} > big; echo rc=$? > stage1; ls -la >> stage1",
        )
    )
    runs = host_fs / "runs"
    rid = new_id()
    before = _free(host_fs)
    proc = corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    # The agent's writes stop at ENOSPC; corral's state has its reserve on
    # the image, so the run still records how it ended (before the reserve
    # it died on `journal write failed: database or disk is full`).
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "disk is full" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    run_dir = runs / rid
    try:
        # Host side: the filesystem holding the image paid at most the quota.
        assert before - _free(host_fs) <= QUOTA + 8 * MIB
        big = run_dir / "workspace" / "big"
        assert big.stat().st_size < QUOTA
        # ENOSPC came before the reserve: the agent could not write into it.
        assert big.stat().st_size <= QUOTA - reserve_bytes(QUOTA)
        # corral's own state was written after the agent filled the disk.
        with Store(run_dir / "state.sqlite", readonly=True) as store:
            # Host git cannot store the agent's file outside the reserve:
            # the run fails with that reason, recorded in its own state.
            run = store.run()
            assert run.state == "failed", run
            assert "space" in (run.end_reason or "").lower(), run
            assert store.sessions()
        report = (run_dir / "report.md").read_text()
        assert "Sessions" in report
        # The watchdog sampled the image (statvfs): the agent's fill shows,
        # and the report's plot draws disk against the quota.
        disk = [x.disk_bytes for x in read_samples(run_dir / "footprint.jsonl")]
        assert disk and all(d is not None for d in disk)
        assert max(d or 0 for d in disk) >= QUOTA // 2
        assert (
            "memory, CPU and disk" in report
            and "disk cap" in (run_dir / "footprint.svg").read_text()
        )
        assert (run_dir / "journal.sqlite").stat().st_size > 0
        # The coordinator is gone: its mount is stale, the next start sweeps it.
        assert is_mounted(run_dir)
        assert sweep_stale(runs) == [rid]
        assert not is_mounted(run_dir) and not (run_dir / "state.sqlite").exists()
        # `corral status` / `resume` find the run again on its image.
        st = corral("status", rid, "--runs-dir", str(runs), cwd=tmp_path)
        assert st.returncode == 0, st.stdout + st.stderr
        assert is_mounted(run_dir)
        with Store(run_dir / "state.sqlite", readonly=True) as store:
            assert store.run().id == rid
    finally:
        sweep_stale(runs)
    assert not is_mounted(run_dir)
