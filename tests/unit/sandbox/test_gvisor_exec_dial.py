"""The forward helper's gVisor dial data (`ExecDial`): exact round trip, bounded, exact form."""

from __future__ import annotations

import json

import pytest

from corral.sandbox.gvisor.connect import DIAL_WIRE_MAX, ExecDial, ExecTarget

DIAL = ExecDial(
    ExecTarget(
        runsc="/usr/bin/runsc",
        state_dir="/run/corral-gvisor/exec-1-ab/state",
        container_id="exec-1-ab",
        uid=1000,
        gid=1000,
        cgroup_procs=("/sys/fs/cgroup/memory/corral/run-x/exec-1-ab/cgroup.procs",),
    ),
    holder=4242,
)


def test_round_trip() -> None:
    assert ExecDial.from_wire(DIAL.to_wire()) == DIAL


def _doc(**change: object) -> bytes:
    doc = json.loads(DIAL.to_wire())
    doc.update(change)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"[]",
        b"{" + b" " * DIAL_WIRE_MAX + b"}",
        _doc(extra=1),
        _doc(holder=0),
        _doc(holder=-1),
        _doc(holder=True),
        _doc(uid="1000"),
        _doc(runsc=""),
        _doc(runsc="/usr/bin/runsc\0x"),
        _doc(state_dir="x" * 513),
        _doc(cgroup_procs="/a"),
        _doc(cgroup_procs=["/a"] * 17),
        _doc(cgroup_procs=[1]),
    ],
)
def test_anything_else_is_refused(wire: bytes) -> None:
    assert ExecDial.from_wire(wire) is None


def test_a_full_size_dial_fits_the_helper_s_control_message() -> None:
    from corral.run import forward_relay

    big = ExecDial(
        ExecTarget(
            runsc="r" * 512,
            state_dir="s" * 512,
            container_id="c" * 512,
            uid=2**31,
            gid=2**31,
            cgroup_procs=("p" * 512,) * 16,
        ),
        holder=2**22,
    )
    wire = big.to_wire()
    assert ExecDial.from_wire(wire) == big
    assert len(b"expose 999999999 65535 exec " + wire) <= forward_relay._CTL_MAX
