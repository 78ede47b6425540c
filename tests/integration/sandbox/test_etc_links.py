"""An /etc symlink into /usr stays a symlink inside (agent start-up cost, issue 13).

Bound, /etc/localtime became a regular file, and ICU (Claude Code is a Bun
binary) then compares every file below /usr/share/zoneinfo with it to name
the zone: 1,344 file operations on each start that the host run does not pay.
"""

from __future__ import annotations

import os

import pytest

from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox]


def test_localtime_names_the_hosts_zone(corral_exec: ExecFn) -> None:
    try:
        link = os.readlink("/etc/localtime")
    except OSError:
        pytest.skip("the host's /etc/localtime is not a symlink: it is bound as a file")
    target = os.path.normpath(os.path.join("/etc", link))
    if not target.startswith("/usr/"):
        pytest.skip(f"the host's /etc/localtime points outside /usr ({link})")
    out = corral_exec("sh", "-c", "readlink /etc/localtime")
    assert out.code == 0, out.stderr
    assert out.stdout.strip() == target
    # The link is as read-only as the bind was.
    out = corral_exec("sh", "-c", "ln -sf /tmp/x /etc/localtime; readlink /etc/localtime")
    assert out.stdout.strip().splitlines()[-1] == target
