"""`corral verify` on a terminal keeps a line per finished category (issue 14)."""

from __future__ import annotations

import pytest

from tests.integration.cli.ptyterm import plain, run_in_pty

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(120)]


def test_category_lines_stay_above_the_report() -> None:
    probes = ("files-read-ssh", "files-read-etc", "net-loopback-udp6")
    args = ["verify"] + [a for p in probes for a in ("--probe", p)]
    rc, out = run_in_pty(args, 100)
    text = plain(out)
    assert rc in (0, 1), text
    assert "files: 2 probes done (" in text, text
    assert "network: 1 probes done (" in text, text
    assert text.index("files: 2 probes done") < text.rindex("probes")
