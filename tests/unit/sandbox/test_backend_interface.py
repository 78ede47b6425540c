"""The backend interface's pure parts: configs, freezing, outcome reports and journaling."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from corral.broker.actions import Identity
from corral.broker.journal import outcome_observations
from corral.errors import CgroupError, ConfigError, LayerUnavailableError
from corral.run.mission import parse_mission
from corral.sandbox.backend import (
    GVisorConfig,
    MicroVMConfig,
    NamespaceConfig,
    backend_config,
    load_backend,
)
from corral.sandbox.cgroup import Cgroup, CgroupLayout, CgroupUsage
from corral.sandbox.namespace import NamespaceBackend, exec_result
from corral.sandbox.spec import ExecResult, Limits

# -- choosing a backend ------------------------------------------------------


def test_backend_config_by_name() -> None:
    assert backend_config("namespace") == NamespaceConfig()
    assert backend_config("gvisor") == GVisorConfig()
    assert backend_config("microvm") == MicroVMConfig()
    with pytest.raises(ConfigError, match="unknown backend 'vmware'"):
        backend_config("vmware")


def test_configs_are_frozen_values() -> None:
    cfg = NamespaceConfig(init_kind="python")
    with pytest.raises(AttributeError):
        cfg.init_kind = "c"
    assert cfg == NamespaceConfig("python") and cfg != NamespaceConfig()
    assert len({cfg, NamespaceConfig("python"), GVisorConfig(platform="ptrace")}) == 2
    assert isinstance(load_backend(NamespaceConfig()), NamespaceBackend)


@pytest.mark.parametrize("config", [GVisorConfig(), MicroVMConfig()], ids=["gvisor", "microvm"])
def test_missing_backend_module_is_a_refusal_naming_it(
    config: GVisorConfig | MicroVMConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes the import fail as a missing module does.
    monkeypatch.setitem(sys.modules, f"corral.sandbox.{config.kind}", None)
    with pytest.raises(LayerUnavailableError) as info:
        load_backend(config)
    assert info.value.layer == config.kind


_MISSION = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
{backend}
[[checks]]
name = "ok"
run = "true"
+++
# m
"""


def test_mission_backend_for_all_or_per_environment() -> None:
    default = parse_mission(_MISSION.format(backend=""), "/m/MISSION.md").settings.backend
    assert (default.agent, default.product, default.verifier) == ("namespace",) * 3
    every = parse_mission(_MISSION.format(backend='backend = "gvisor"'), "/m/MISSION.md")
    assert every.settings.backend.product == "gvisor"
    table = '[backend]\nagent = "microvm"\n'
    one = parse_mission(_MISSION.format(backend=table), "/m/MISSION.md").settings.backend
    assert (one.agent, one.product) == ("microvm", "namespace")
    for bad in ('backend = "vmware"', '[backend]\nagnet = "gvisor"\n'):
        with pytest.raises(ConfigError):
            parse_mission(_MISSION.format(backend=bad), "/m/MISSION.md")


# -- freeze/thaw through the cgroup ----------------------------------------------


def test_freeze_v2_writes_cgroup_freeze_and_waits_for_frozen(tmp_path: Path) -> None:
    cg = Cgroup(CgroupLayout("v2", (), str(tmp_path)), "corral/exec-1-ab")
    d = tmp_path / "corral" / "exec-1-ab"
    d.mkdir(parents=True)
    (d / "cgroup.freeze").write_text("0\n")
    (d / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    cg.freeze()
    assert (d / "cgroup.freeze").read_text() == "1"
    # The kernel has not stopped every task yet: freeze() must not return.
    (d / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    with pytest.raises(CgroupError, match="not thawed"):
        cg.thaw(timeout_s=0.05)
    assert (d / "cgroup.freeze").read_text() == "0"
    (d / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    cg.thaw()


def test_freeze_v1_uses_the_freezer_controller(tmp_path: Path) -> None:
    freezer = tmp_path / "freezer"
    cg = Cgroup(CgroupLayout("v1", (("freezer", str(freezer)),), None), "corral/exec-1-ab")
    d = freezer / "corral" / "exec-1-ab"
    d.mkdir(parents=True)
    (d / "freezer.state").write_text("THAWED\n")
    cg.freeze()
    assert (d / "freezer.state").read_text() == "FROZEN"
    cg.thaw()
    assert (d / "freezer.state").read_text() == "THAWED"


def test_no_freezer_refuses(tmp_path: Path) -> None:
    cg = Cgroup(CgroupLayout("v1", (("memory", str(tmp_path)),), None), "corral/x")
    with pytest.raises(CgroupError, match="no freezer"):
        cg.freeze()


# -- how a sandbox ended (pure) ----------------------------------------------------

_USAGE = CgroupUsage(
    peak_memory_bytes=5 << 20, cpu_s=0.5, oom_kills=0, pids_limit_hits=2, memory_limit_hits=0
)


def _result(**kw: object) -> ExecResult:
    args: dict[str, object] = {
        "events": [{"event": "exit", "code": 3}],
        "host_code": 3,
        "bwrap_rc": 0,
        "usage": _USAGE,
        "leftovers": 1,
        "wall_s": 0.25,
        "layers": {"bwrap": True},
        "timed_out": False,
        "interrupted": 0,
    }
    args.update(kw)
    return exec_result(**args)  # type: ignore[arg-type]


def test_exec_result_takes_numbers_from_the_host() -> None:
    r = _result()
    assert (r.exit, r.reason, r.cpu_s, r.peak_memory_bytes) == (3, "exited", 0.5, 5 << 20)
    assert (r.processes_killed_at_end, r.pids_limit_hits) == (1, 2)


def test_exec_result_oom_timeout_interrupt() -> None:
    oom = CgroupUsage(0, 0.0, 1, 0, 1)
    r = _result(events=[], host_code=137, usage=oom)
    assert (r.exit, r.reason, r.oom_kills) == (137, "oom", 1)
    assert _result(timed_out=True).exit == 124
    assert _result(interrupted=15).reason == "killed"


def test_exec_result_two_exit_events_fail_closed() -> None:
    twice = [{"event": "exit", "code": 0}, {"event": "exit", "code": 0}]
    r = _result(events=twice, host_code=0)
    assert (r.exit, r.reason) == (125, "refused")


def test_outcome_observations_limits_then_exit() -> None:
    r = _result(events=[], host_code=137, usage=CgroupUsage(0, 0.0, 2, 3, 0), leftovers=4)
    obs = outcome_observations(
        r,
        Identity(run="r1", session="2", env="verifier"),
        Limits(memory_bytes=1 << 20, pids=8, timeout_s=5),
    )
    got = [(o.target, o.decision) for o in obs]
    assert got == [
        ("oom_kill", "deny"),
        ("pids_limit", "deny"),
        ("killed_at_teardown", "observe"),
        ("exit", "observe"),
    ]
    assert all(
        (o.kind, o.env, o.run, o.session) == ("process_event", "verifier", "r1", "2") for o in obs
    )
    assert obs[-1].detail["exit"] == 137
    timeout = outcome_observations(
        _result(timed_out=True, leftovers=0, usage=None),
        Identity(run="r1"),
        Limits(timeout_s=5),
    )
    assert [o.target for o in timeout] == ["timeout", "exit"]
    assert "5s" in timeout[0].reason
