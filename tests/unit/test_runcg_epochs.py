"""Run cgroups and run directories named per lease epoch (pure parts, on a fake hierarchy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import CgroupError
from corral.run.runcg import RunCgroup, parse_cgroup_key, run_cgroup_path
from corral.sandbox.cgroup import CgroupLayout
from corral.store.worker import run_dir


def test_paths_and_keys() -> None:
    assert run_cgroup_path("r1") == "corral/run-r1"
    assert run_cgroup_path("r1", 3) == "corral/run-r1/lease-3"
    assert parse_cgroup_key("r1") == ("r1", None)
    assert parse_cgroup_key("r1:3") == ("r1", 3)
    for bad in ("r1:", "r1:x", "r1:0", "r1:-2", "r1:3:4"):
        with pytest.raises(CgroupError):
            parse_cgroup_key(bad)
    layout = CgroupLayout("v2", (), "/nonexistent")
    assert RunCgroup(layout, "r1", 3).key == "r1:3"
    assert parse_cgroup_key(RunCgroup(layout, "r1").key) == ("r1", None)


def test_run_id_suffixes_cannot_alias_an_epoch() -> None:
    # Run ids may contain '-': "a-lease-2" must not name run "a"'s epoch 2.
    assert run_cgroup_path("a", 2) != run_cgroup_path("a-lease-2")
    assert not run_cgroup_path("a-lease-2").startswith(run_cgroup_path("a") + "/")


def test_only_older_epochs_are_swept(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    for name in ("lease-1", "lease-2", "lease-3", "lease-4", "lease-x", "helpers", "lease-02"):
        (root / "corral/run-r1" / name).mkdir(parents=True)
    (root / "corral/run-r10/lease-1").mkdir(parents=True)
    layout = CgroupLayout("v2", (), str(root))
    assert RunCgroup(layout, "r1", 3).older_epochs() == [1, 2]
    assert RunCgroup(layout, "r1", 1).older_epochs() == []
    assert RunCgroup(layout, "r1").older_epochs() == []  # a local run has no epochs


def test_run_dir_is_per_epoch_and_named_by_the_run(tmp_path: Path) -> None:
    a, b = run_dir(tmp_path, "r1", 1), run_dir(tmp_path, "r1", 2)
    assert a != b and a.name == b.name == "r1"
    assert a.parent.parent == b.parent.parent == tmp_path / "r1"
    with pytest.raises(Exception, match="refusing run id"):
        run_dir(tmp_path, "../x", 1)
