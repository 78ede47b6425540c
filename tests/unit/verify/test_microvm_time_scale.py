"""Under TCG a probe's wall-clock limit and the waits it races against scale together (pure).

A probe judged by "it started, the limit killed it before it finished"
(host-side files, the exit report) only tests the limit when the limit is
longer than the guest's Python start and shorter than the probe's wait; the
microVM multiplies both by `time_scale`, keeping their ratio.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from corral.verify.backends import CorralBackend, RunSpec
from corral.verify.model import ProbeLimits
from corral.verify.probes import PRELUDE, all_probes


def _timeout(argv: list[str]) -> float:
    return float(argv[argv.index("--timeout") + 1])


@pytest.mark.parametrize(("name", "want"), [("namespace", 1.5), ("gvisor", 1.5), ("microvm", 18.0)])
def test_wall_clock_limit_is_scaled_only_for_the_emulated_guest(name: str, want: float) -> None:
    run = RunSpec("/w", ProbeLimits(timeout_s=1.5))
    assert _timeout(CorralBackend(name).argv(["true"], run)) == want


def test_microvm_deadline_covers_a_loaded_tcg_guest() -> None:
    vm = CorralBackend("microvm")
    # 4x let 20 s probes die before their first line at load 10-20.
    assert vm.deadline_scale >= 12 and vm.time_scale >= 12


def test_every_probe_racing_a_short_wall_clock_limit_scales_its_waits() -> None:
    racing = [p for p in all_probes() if p.limits.timeout_s is not None and p.limits.timeout_s < 5]
    assert {p.id for p in racing} >= {"res-wall-clock", "proc-timeout-daemon"}
    for p in racing:
        assert "time.sleep(" in p.code and "SLOW" in p.code, p.id


def test_prelude_reads_the_scale_from_the_parameters() -> None:
    for params, want in (({}, "1.0"), ({"slow": 12.0}, "12.0")):
        program = (
            f"import json\nP = json.loads({json.dumps(json.dumps(params))})\n{PRELUDE}\nprint(SLOW)"
        )
        out = subprocess.run(
            [sys.executable, "-I", "-S", "-c", program, "m"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.splitlines() == ["CORRAL-START", want]
