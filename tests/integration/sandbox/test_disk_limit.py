"""issue 10: `corral exec --disk` bounds every writable scratch tmpfs.

The host-side judge is the kernel's peak memory counter of the sandbox's
cgroup: tmpfs pages are charged there, so what the sandbox managed to store
in its scratch areas shows up in `peak_memory_bytes` whatever it claims.
"""

from __future__ import annotations

import pytest

from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox]

MIB = 1 << 20
AREAS = ("/tmp", "/var/tmp", "/home/corral", "/dev/shm")
WANT = 48  # MiB written into each area

FILL = f"""
import errno, sys
for area in {AREAS!r}:
    n = 0
    try:
        with open(area + "/fill", "wb") as fh:
            for _ in range({WANT}):
                fh.write(b"x" * (1 << 20)); fh.flush(); n += 1
        print(area, "full", n, flush=True)
    except OSError as e:
        print(area, errno.errorcode.get(e.errno, e.errno), n, flush=True)
"""


def test_scratch_areas_stop_at_the_disk_size(corral_exec: ExecFn) -> None:
    out = corral_exec("python3", "-c", FILL, opts=("--memory", "512M", "--disk", "8M"), timeout=60)
    assert out.code == 0, out.stderr
    peak = out.summary["peak_memory_bytes"]
    # Four areas of 8 MiB plus the interpreter; without --disk this is ~190 MiB.
    assert isinstance(peak, int)
    assert peak <= len(AREAS) * 8 * MIB + 40 * MIB, f"peak {peak >> 20} MiB"
    lines = dict((ln.split()[0], ln.split()[1:]) for ln in out.stdout.splitlines())
    assert set(lines) == set(AREAS), out.stdout
    for area in AREAS:
        assert lines[area][0] == "ENOSPC", (area, lines[area])


def test_disk_size_is_validated(corral_exec: ExecFn) -> None:
    out = corral_exec("true", opts=("--disk", "lots"))
    assert out.code == 2
    assert "invalid size" in out.stderr
