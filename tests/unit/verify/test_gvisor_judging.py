"""How `corral verify` judges a backend with a kernel of its own (gVisor), pure."""

from __future__ import annotations

from corral.sandbox.gvisor.ps import Located, parse_ps, ps_argv
from corral.verify.backends import make_backend
from corral.verify.model import Evidence
from corral.verify.oracles import Reported
from corral.verify.probes import all_probes

_OK = ({"syscall": "io_uring_setup", "ret": 3, "errno": None, "ok": True},)


def test_host_kernel_attack_served_by_the_sentry_is_no_host_effect() -> None:
    guest = Evidence(results=_OK, ctx={"guest_kernel": "gVisor's sentry"})
    assert Reported(host_kernel_only=True).judge(guest).observed == "denied"
    # The same report on a backend that runs on the host kernel is the attack working.
    assert Reported(host_kernel_only=True).judge(Evidence(results=_OK)).observed == "allowed"
    assert (
        Reported(host_kernel_only=True)
        .judge(Evidence(results=_OK, ctx={"guest_kernel": ""}))
        .observed
        == "allowed"
    )
    # Usability probes keep judging success as success.
    assert Reported().judge(guest).observed == "allowed"


def test_only_gvisor_names_a_guest_kernel_and_skips_host_status_probes() -> None:
    ids = {p.id for p in all_probes()}
    for guest in ("gvisor", "microvm"):
        gv = make_backend(guest)
        assert gv.guest_kernel
        na = gv.not_applicable_probes()
        assert na and set(na) <= ids and all(na.values())
    for name in ("namespace", "none", "bwrap-basic"):
        b = make_backend(name)
        assert b.guest_kernel is None
        assert b.not_applicable_probes() == {}
        assert b.inside_count(1) is None and b.host_tasks(1) is None


def test_runsc_ps_output_is_bounded_and_typed() -> None:
    assert parse_ps(b"[1, 2, 3]") == [1, 2, 3]
    for bad in (b"", b"{}", b'["1"]', b"[true]", b"[1" + b", 1" * 400000 + b"]", b"\xff"):
        assert parse_ps(bad) is None
    t = Located(runsc="/usr/bin/runsc", state_dir="/s", container_id="c", holder=7)
    argv = ps_argv(t, 9)
    assert argv[:6] == ["nsenter", "-t", "9", "-n", "-p", "-m"]
    assert argv[-4:] == ["ps", "--format", "json", "c"]
