"""The microvm backend's pure parts: QEMU argv, guest init, initramfs, exit decisions."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from corral.sandbox.microvm.assets import base_entries, module_depends
from corral.sandbox.microvm.cpio import Entry, archive
from corral.sandbox.microvm.plan import (
    GUEST_MODULES,
    Share,
    VMPlan,
    build_argv,
    init_script,
    parse_report,
    shares_for,
)
from corral.sandbox.microvm.plan import GuestReport as R
from corral.sandbox.microvm.vm import decide_vm_exit, kvm_status, tsc_khz
from corral.sandbox.spec import Bind, Limits, SandboxSpec

SPEC = SandboxSpec(
    argv=("/bin/sh", "-c", "echo 'hi there'; exit 3"),
    workspace="/work/ws,1",
    env=(("PATH", "/usr/bin:/bin"), ("X", "a b'c")),
    binds=(Bind("/data", False),),
)


def _plan(accel: str = "tcg") -> VMPlan:
    return VMPlan(
        qemu="/usr/bin/qemu-system-x86_64",
        kernel="/cache/vmlinux-1",
        initrd="/proc/self/fd/3",
        accel=accel,
        memory_mib=512,
        cpus=1,
        shares=shares_for(SPEC),
        status_path="/proc/self/fd/4",
        stdout_path="/proc/self/fd/5",
        stderr_path="/proc/self/fd/6",
        tsc_khz=2_400_000 if accel == "tcg" else None,
    )


GOLDEN_TCG = [
    "/usr/bin/qemu-system-x86_64",
    "-M", "microvm,isa-serial=off",
    "-accel", "tcg,tb-size=64", "-cpu", "max",
    "-m", "512", "-smp", "1",
    "-nodefaults", "-no-user-config", "-display", "none", "-nic", "none", "-no-reboot",
    "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    "-kernel", "/cache/vmlinux-1",
    "-initrd", "/proc/self/fd/3",
    "-append", "quiet loglevel=0 reboot=t panic=-1 rdinit=/init tsc_early_khz=2400000",
    "-device", "virtio-serial-device,max_ports=8",
    "-chardev", "file,id=status,path=/proc/self/fd/4,append=on",
    "-device", "virtserialport,chardev=status,nr=1,name=status",
    "-chardev", "file,id=out,path=/proc/self/fd/5,append=on",
    "-device", "virtserialport,chardev=out,nr=2,name=out",
    "-chardev", "file,id=err,path=/proc/self/fd/6,append=on",
    "-device", "virtserialport,chardev=err,nr=3,name=err",
    "-fsdev", "local,id=usr,path=/usr,security_model=none,multidevs=remap,readonly=on",
    "-device", "virtio-9p-device,fsdev=usr,mount_tag=usr",
    "-fsdev", "local,id=ws,path=/work/ws,,1,security_model=none,multidevs=remap",
    "-device", "virtio-9p-device,fsdev=ws,mount_tag=ws",
    "-fsdev", "local,id=b0,path=/data,security_model=none,multidevs=remap,readonly=on",
    "-device", "virtio-9p-device,fsdev=b0,mount_tag=b0",
]  # fmt: skip


def test_argv_golden_tcg() -> None:
    assert build_argv(_plan()) == GOLDEN_TCG


def test_argv_kvm_uses_host_cpu_and_no_tsc_hint() -> None:
    argv = build_argv(_plan("kvm"))
    assert argv[3:7] == ["-accel", "kvm", "-cpu", "host"]
    assert not any("tsc_early_khz" in a for a in argv)


def test_argv_is_fresh_each_call_and_has_no_network_device() -> None:
    plan = _plan()
    a, b = build_argv(plan), build_argv(plan)
    assert a == b and a is not b
    assert "-netdev" not in a and a[a.index("-nic") + 1] == "none"


def test_shares_usr_readonly_workspace_writable_binds_as_given() -> None:
    assert shares_for(SPEC) == (
        Share("usr", "/usr", "/usr", False),
        Share("ws", "/work/ws,1", "/work/ws,1", True),
        Share("b0", "/data", "/data", False),
    )


def test_init_script_runs_command_unprivileged_with_exact_env() -> None:
    script = init_script(SPEC, shares_for(SPEC), uid=1000, gid=1001)
    assert script.startswith("#!/corral/busybox sh\n")
    run = next(line for line in script.splitlines() if "exec /usr/bin/setpriv" in line)
    assert "--reuid=1000 --regid=1001 --clear-groups" in run
    assert "--bounding-set=-all --no-new-privs" in run
    # The environment is exactly the spec's, shell-quoted.
    assert "/usr/bin/env -i -- PATH=/usr/bin:/bin 'X=a b'\"'\"'c' /bin/sh -c" in run
    assert run.endswith("</dev/null >/dev/vport0p2 2>/dev/vport0p3 )")
    # The report port is root-only; the command's ports are the command's.
    assert "$B chmod 0600 /dev/vport0p1" in script
    assert "$B chown 1000:1001 /dev/vport0p2 /dev/vport0p3" in script
    assert 'echo "$kind $rc $left $ooms $hits" >/dev/vport0p1' in script
    # Without a SandboxNet there is no relay and no port 4.
    assert "relay.py" not in script and "vport0p4" not in script
    assert script.index("echo start >/dev/vport0p1") < script.index("/usr/bin/setpriv")
    assert "$B mount -t 9p -o $opts,ro usr /usr" in script
    assert "$B mount -t 9p -o $opts ws /work/ws,1 ||" in script
    # /tmp is mounted before the shares (a workspace below /tmp stays visible).
    assert script.index("tmpfs /tmp") < script.index(" usr /usr")


def test_argv_net_port_is_the_given_socket_and_still_no_nic() -> None:
    argv = build_argv(dataclasses.replace(_plan(), net_fd=7))
    i = argv.index("socket,id=net,fd=7")
    assert argv[i - 1 : i + 3] == [
        "-chardev", "socket,id=net,fd=7", "-device", "virtserialport,chardev=net,nr=4,name=net",
    ]  # fmt: skip
    assert "-netdev" not in argv and argv[argv.index("-nic") + 1] == "none"
    assert "socket,id=net" not in " ".join(build_argv(_plan()))


def test_init_script_starts_the_relay_as_root_before_the_command() -> None:
    script = init_script(SPEC, shares_for(SPEC), uid=1000, gid=1001, net=True)
    relay = script.index("/usr/bin/python3 -I -S /corral/relay.py /dev/vport0p4")
    # Port 4 is root-only before the relay opens it; the command starts after GO.
    assert script.index("$B chmod 0600 /dev/vport0p4") < relay
    assert relay < script.index("read -r go </run/corral-go") < script.index("/usr/bin/setpriv")
    # The relay and its subshell are not the command's leftovers.
    count = script[script.index("left=0") : script.index('echo "$kind $rc $left $ooms $hits"')]
    assert '"$p" = "$relay"' in count and '"$pp" = "$relay"' in count


@pytest.mark.parametrize(
    "spec",
    [
        SandboxSpec(argv=("A=b",), workspace="/w", env=()),
        SandboxSpec(argv=("true",), workspace="/w", env=(("A=B", "c"),)),
        SandboxSpec(argv=("true",), workspace="/w", env=(("", "c"),)),
    ],
)
def test_init_script_refuses_what_env_would_misread(spec: SandboxSpec) -> None:
    with pytest.raises(ValueError):
        init_script(spec, shares_for(spec), uid=1, gid=1)


def test_cpio_golden() -> None:
    data = archive([Entry.dir("a"), Entry.file("a/f", b"xyz", 0o600), Entry.symlink("l", "a")])
    assert data[:110] == (
        b"070701" b"00000001" b"000041ED" b"00000000" b"00000000" b"00000001" b"00000000"
        b"00000000" b"00000000" b"00000000" b"00000000" b"00000000" b"00000002" b"00000000"
    )  # fmt: skip
    assert len(data) % 4 == 0
    assert data.endswith(b"TRAILER!!!\0" + b"\0" * (-(110 + 11) % 4))
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(archive(
        [Entry.dir("a"), Entry.file("a/f", b"xyz", 0o600), Entry.symlink("l", "a")]
    )).hexdigest()  # fmt: skip
    assert b"a/f\0" in data and b"xyz" in data


@pytest.mark.parametrize("name", ["/abs", "a/../b", "nul\0"])
def test_cpio_refuses_escaping_names(name: str) -> None:
    with pytest.raises(ValueError):
        archive([Entry.file(name, b"")])


def test_base_entries_layout() -> None:
    mods = {m: b"\0" for m in GUEST_MODULES}
    names = [e.name for e in base_entries(b"BB", mods)]
    assert "corral/busybox" in names and "init" not in names
    assert [n for n in names if n.startswith("corral/modules/")] == [
        f"corral/modules/{m}.ko" for m in GUEST_MODULES
    ]
    links = {e.name: e.target for e in base_entries(b"BB", mods) if e.target}
    assert links == {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}


def test_module_depends() -> None:
    assert module_depends(b"junk\0license=GPL\0depends=virtio,virtio_ring\0name=x\0") == (
        "virtio",
        "virtio_ring",
    )
    assert module_depends(b"\0depends=\0") == ()
    assert module_depends(b"nothing") == ()


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b"exit 0 0 0 0\n", R("exit", 0)),
        (b"exit 137 2 0 0\n", R("exit", 137, left=2)),
        (b"oom 137 0 1 0\n", R("oom", 137, oom_kills=1)),
        (b"start\nexit 3 1 0 4\n", R("exit", 3, left=1, pids_limit_hits=4)),
        (b"exit 0 999999 999999 999999\n", R("exit", 0, "", 999999, 999999, 999999)),
        (b"start\n", None),
        (b"start\nstart\nexit 3 0 0 0\n", None),
        (b"oom 0 0 0 0\n", None),
        (b"error 125 cannot mount ws\n", R("error", 125, "cannot mount ws")),
        # A terminal escape from the guest never reaches a message intact.
        (b"error 125 \x1b[2J\n", R("error", 125, "?[2J")),
        (b"exit 0 0 0 0\nexit 1 0 0 0\n", None),
        (b"exit 0 0 0 0", None),
        (b"exit 256 0 0 0\n", None),
        (b"exit 0 0 0 0 extra\n", None),
        (b"exit -1 0 0 0\n", None),
        (b"", None),
        (b"exit 0 0 0 0\n" + b" " * 5000, None),
        # The counts are the guest's word: exactly three, digits, bounded, nothing else.
        (b"exit 0\n", None),
        (b"exit 0 0\n", None),
        (b"exit 0 0 0\n", None),
        (b"exit 0 0  0 0\n", None),
        (b"exit 0 -1 0 0\n", None),
        (b"exit 0 1000000 0 0\n", None),
        (b"exit 0 0 1000000 0\n", None),
        (b"exit 0 0 0 1e9\n", None),
        (b"exit 0 \xd9\xa3 0 0\n", None),
        (b"exit 0 0 0x10 0\n", None),
    ],
)
def test_parse_report_strict(data: bytes, want: R | None) -> None:
    assert parse_report(data) == want


def _decide(
    rc: int | None,
    report: tuple[str, int, str] | None,
    *,
    oom: int = 0,
    timed_out: bool = False,
    sig: int = 0,
) -> tuple[int, str]:
    code, reason, _ = decide_vm_exit(
        qemu_rc=rc, report=report, oom_kills=oom, timed_out=timed_out, interrupted=sig
    )
    return code, reason


def test_decide_vm_exit() -> None:
    assert _decide(0, ("exit", 3, "")) == (3, "exited")
    assert _decide(0, ("exit", 137, "")) == (137, "killed")
    assert _decide(0, ("oom", 137, "")) == (137, "oom")
    assert _decide(0, ("error", 125, "cannot mount ws")) == (125, "refused")
    # No report, or a report from a VM that did not end cleanly, is a failure.
    assert _decide(0, None) == (125, "refused")
    assert _decide(1, ("exit", 0, "")) == (125, "refused")
    assert _decide(-9, None) == (137, "killed")
    assert _decide(-9, ("exit", 0, ""), oom=1) == (137, "oom")
    assert _decide(-9, ("exit", 0, ""), timed_out=True) == (124, "timeout")
    assert _decide(-9, None, sig=15) == (143, "killed")


def test_kvm_status() -> None:
    hw = "processor\t: 0\nflags\t\t: fpu vme vmx sse\n"
    pv = "processor\t: 0\nflags\t\t: fpu vme sse hypervisor\n"
    assert kvm_status(hw, dev_kvm=True) is None
    assert kvm_status(pv, dev_kvm=True) == (
        "paravirtual, not usable for microvm; TCG available (slow, defence in depth only)"
    )
    assert "TCG available" in (kvm_status(pv, dev_kvm=False) or "")
    assert "/dev/kvm missing" in (kvm_status(hw, dev_kvm=False) or "")
    assert tsc_khz("cpu MHz\t\t: 2445.422\n") == 2445422
    assert tsc_khz("") is None


def test_init_script_binds_protected_paths_read_only_after_the_shares() -> None:
    spec = SandboxSpec(argv=("true",), workspace="/w", env=())
    script = init_script(
        spec, shares_for(spec), uid=5, gid=5, guest_binds=(("/w/.git", False), ("/w/d", True))
    )
    lines = script.splitlines()
    ro = lines.index("$B mount -o remount,bind,ro /w/.git || fail 'cannot protect'")
    assert lines[ro - 1] == "$B mount -o bind /w/.git /w/.git || fail 'cannot protect'"
    assert "$B mount -o bind /w/d /w/d || fail 'cannot protect'" in lines
    assert "$B mount -o remount,bind,ro /w/d || fail 'cannot protect'" not in lines
    at = script.index("remount,bind,ro /w/.git")
    assert script.index(" ws /w ") < at < script.index("/usr/bin/setpriv")


def test_init_script_pids_limit_is_the_guest_cgroup_of_the_command_alone() -> None:
    spec = SandboxSpec(argv=("true",), workspace="/w", env=(), limits=Limits(pids=17))
    script = init_script(spec, shares_for(spec), uid=5, gid=5)
    assert "echo 17 >/sys/fs/cgroup/cmd/pids.max || fail 'cannot set the pids limit'" in script
    assert script.index("pids.max") < script.index("/usr/bin/setpriv")
    # The command's subshell joins the cgroup (init does not) and then execs the command.
    run = next(line for line in script.splitlines() if "/usr/bin/setpriv" in line)
    assert run.startswith(
        '( [ "$cg" = / ] || echo 0 >"/sys/fs/cgroup$cg/cgroup.procs"'
        " || fail 'cannot join the pids cgroup';"
    )
    assert "[ ${#hits} -gt 6 ] && hits=999999" in script
    assert " exec /usr/bin/setpriv " in run and run.endswith(" )")
    assert "</sys/fs/cgroup/cmd/pids.events" in script
    nolimit = SandboxSpec(argv=("true",), workspace="/w", env=())
    plain = init_script(nolimit, shares_for(nolimit), uid=5, gid=5)
    assert "pids.max" not in plain and "cg=/\n" in plain


def test_trust_bundle_travels_in_the_run_archive_root_owned_read_only() -> None:
    from corral.sandbox.microvm.cpio import archive
    from corral.sandbox.microvm.plan import MAX_TRUST_BUNDLE, trust_entries

    entries = trust_entries(b"PEM")
    assert [(e.name, oct(e.mode)) for e in entries] == [
        ("etc/ssl", "0o40755"),
        ("etc/ssl/certs", "0o40755"),
        ("etc/ssl/certs/ca-certificates.crt", "0o100644"),
    ]
    assert entries[-1].data == b"PEM"
    assert b"etc/ssl/certs/ca-certificates.crt\0" in archive(entries)
    with pytest.raises(ValueError):
        trust_entries(b"x" * (MAX_TRUST_BUNDLE + 1))


def test_guest_counts_are_labelled_claims_never_from_an_error_or_timeout() -> None:
    from corral.sandbox.microvm.vm import guest_counts

    claimed = guest_counts(R("oom", 137, oom_kills=1, pids_limit_hits=3))
    assert claimed["oom_kills"] == 1 and claimed["pids_limit_hits"] == 3
    assert str(claimed["claimed_by"]).startswith("guest init")
    assert guest_counts(R("exit", 0)) == {}
    assert guest_counts(R("error", 125, "x")) == {}
    assert guest_counts(None) == {}
