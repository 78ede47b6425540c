"""issue 10: shm, tmpfs and page-cache pages a sandbox fills are charged to its cap.

Judged from the kernel's peak counters through `corral verify`: under
`--backend none` (the control, in the suite's measuring cgroup with no cap)
each probe's 192 MiB shows; a corral sandbox keeps the peak under 64 MiB.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.verify.test_verify_suite import _verify

IDS = {"fp-shm-pages", "fp-tmpfs-pages", "fp-page-cache"}
ARGS = ("--no-netns", *(a for i in sorted(IDS) for a in ("--probe", i)))


def _observed(report: dict[str, object]) -> dict[str, tuple[str, str]]:
    probes = report["probes"]
    assert isinstance(probes, list)
    return {p["id"]: (p["observed"], p["evidence"][:200]) for p in probes if p["id"] in IDS}


@pytest.mark.requires_sandbox
@pytest.mark.timeout(120)
def test_page_probes_are_denied_by_a_corral_sandbox(tmp_path: Path) -> None:
    seen = _observed(_verify(tmp_path, "--backend", "namespace", *ARGS, timeout=110))
    assert set(seen) == IDS
    assert all(obs == "denied" for obs, _ in seen.values()), seen


@pytest.mark.requires_root
@pytest.mark.timeout(120)
def test_page_probes_see_the_pages_without_a_sandbox(tmp_path: Path) -> None:
    seen = _observed(_verify(tmp_path, "--backend", "none", *ARGS, timeout=110))
    assert set(seen) == IDS
    assert all(obs == "allowed" for obs, _ in seen.values()), seen
    # The probes clean up after themselves on a peer that shares the host's.
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith("corral-fp-")]
