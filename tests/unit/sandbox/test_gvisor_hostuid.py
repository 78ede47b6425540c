"""The map of runsc's user namespace (gvisor.hostuid)."""

from __future__ import annotations

import pytest

from corral.sandbox.gvisor.hostuid import id_map


def test_nobody_is_the_leased_uid_root_and_the_command_uid_stay() -> None:
    assert id_map(64007, 1000) == "0 0 1\n1000 1000 1\n65534 64007 1\n"


@pytest.mark.parametrize(("host", "inside"), [(0, 1000), (1000, 1000), (65534, 1000), (64000, 0)])
def test_overlapping_ids_are_refused(host: int, inside: int) -> None:
    with pytest.raises(ValueError):
        id_map(host, inside)
