"""The pure parts of the unix-socket supervisor: `admit()` and the notify filter."""

from __future__ import annotations

import errno
import os
import struct

import pytest

from corral.sandbox import seccomp
from corral.sandbox.unix_admit import UnixGrant, UnixTarget, admit
from corral.sandbox.unix_supervisor import _diag_inodes, notify_filter

_SOCK = UnixTarget("/ws/app.sock", dev=42, ino=7, is_socket=True)
_GRANT = UnixGrant("/ws/app.sock", dev=42, ino=7)


def test_host_socket_is_refused_with_eacces() -> None:
    d = admit(_SOCK, (), inside=False)
    assert (d.allow, d.rule, d.error) == (False, "host-socket", errno.EACCES)


def test_own_socket_is_admitted() -> None:
    d = admit(_SOCK, (), inside=True)
    assert (d.allow, d.rule) == (True, "inside")


def test_grant_admits_exactly_its_inode() -> None:
    assert admit(_SOCK, (_GRANT,), inside=False).allow
    assert admit(_SOCK, (_GRANT,), inside=False).rule == "allow-unix /ws/app.sock"
    # Same path, other inode (the host service was restarted, or a rename):
    moved = UnixTarget("/ws/app.sock", dev=42, ino=8, is_socket=True)
    assert not admit(moved, (_GRANT,), inside=False).allow
    other_fs = UnixTarget("/ws/app.sock", dev=43, ino=7, is_socket=True)
    assert not admit(other_fs, (_GRANT,), inside=False).allow


def test_non_socket_is_refused_like_the_kernel_does() -> None:
    d = admit(UnixTarget("/ws/f", 42, 7, is_socket=False), (_GRANT,), inside=True)
    assert (d.allow, d.error) == (False, errno.ECONNREFUSED)


# -- the notify filter, run by the pure BPF interpreter -------------------------

_NR = {"x86_64": (42, 41, 53), "aarch64": (203, 198, 199)}
_AF_UNIX, _AF_INET = 1, 2
_STREAM, _DGRAM, _RAW, _SEQPACKET = 1, 2, 3, 5
_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000
_USER_NOTIF = 0x7FC0_0000


def _run(nr: int, args: tuple[int, ...] = (), arch: int | None = None) -> int:
    return seccomp.evaluate(notify_filter(), nr, args, arch)


@pytest.fixture
def nrs() -> tuple[int, int, int]:
    machine = os.uname().machine
    if machine not in _NR:
        pytest.skip(f"no syscall table for {machine}")
    return _NR[machine]


def test_program_is_well_formed() -> None:
    for machine in _NR:
        seccomp.validate_bpf(notify_filter(machine))


def test_every_connect_is_notified(nrs: tuple[int, int, int]) -> None:
    connect = nrs[0]
    assert _run(connect, (3, 0x7FFF_0000, 110)) == _USER_NOTIF
    assert _run(connect, (0xFFFF_FFFF_0000_0003,)) == _USER_NOTIF


@pytest.mark.parametrize("kind", [_DGRAM, _RAW, _DGRAM | _NONBLOCK_CLOEXEC, _RAW | 0o4000])
@pytest.mark.parametrize("call", [1, 2])
def test_unix_datagram_sockets_are_refused(nrs: tuple[int, int, int], kind: int, call: int) -> None:
    ret = _run(nrs[call], (_AF_UNIX, kind, 0))
    assert seccomp.ret_errno(ret) == errno.EPERM
    # The kernel reads int arguments: garbage in the upper halves changes nothing.
    ret = _run(nrs[call], (0xDEAD_0000_0000_0000 | _AF_UNIX, 0xBEEF_0000_0000_0000 | kind, 0))
    assert seccomp.ret_errno(ret) == errno.EPERM


@pytest.mark.parametrize(
    ("domain", "kind"),
    [(_AF_UNIX, _STREAM), (_AF_UNIX, _SEQPACKET | _NONBLOCK_CLOEXEC), (_AF_INET, _DGRAM)],
)
def test_other_sockets_are_allowed(nrs: tuple[int, int, int], domain: int, kind: int) -> None:
    assert _run(nrs[1], (domain, kind, 0)) == seccomp.RET_ALLOW
    assert _run(nrs[2], (domain, kind, 0)) == seccomp.RET_ALLOW


def test_foreign_abis_are_killed(nrs: tuple[int, int, int]) -> None:
    # i386 socketcall/connect and x32 numbers must not bypass the notification.
    assert _run(102, (3,), arch=seccomp.AUDIT_ARCH_I386) == seccomp.RET_KILL_PROCESS
    if os.uname().machine == "x86_64":
        assert _run(0x4000_0000 | nrs[0]) == seccomp.RET_KILL_PROCESS


@pytest.mark.parametrize("nr", [425, 426, 427])
def test_io_uring_is_refused(nrs: tuple[int, int, int], nr: int) -> None:
    # IORING_OP_CONNECT would connect without a connect() syscall to notify.
    assert seccomp.ret_errno(_run(nr)) == errno.EPERM


def test_unrelated_syscalls_pass(nrs: tuple[int, int, int]) -> None:
    assert _run(0) == seccomp.RET_ALLOW


# -- the UNIX_DIAG reply parser ---------------------------------------------------


class _FakeNetlink:
    """Replays canned netlink datagrams; records what was sent."""

    def __init__(self, *replies: bytes) -> None:
        self.replies = list(replies)
        self.sent: list[bytes] = []

    def sendto(self, data: bytes, _addr: tuple[int, int]) -> int:
        self.sent.append(data)
        return len(data)

    def recv(self, _n: int) -> bytes:
        return self.replies.pop(0) if self.replies else b""


def _nlmsg(kind: int, payload: bytes) -> bytes:
    body = struct.pack("<IHHII", 16 + len(payload), kind, 2, 1, 0) + payload
    return body + b"\0" * (-len(body) % 4)


def _unix_msg(vfs: tuple[int, int] | None) -> bytes:
    head = struct.pack("<BBBBIII", 1, 1, 10, 0, 1234, 0, 0)
    if vfs is None:
        return head
    return head + struct.pack("<HHII", 12, 1, vfs[1], vfs[0])  # UNIX_DIAG_VFS: ino, dev


def test_diag_parser_collects_bound_inodes_with_user_dev_numbers() -> None:
    kdev = (8 << 20) | 3  # the kernel's dev_t for 8:3
    sock = _FakeNetlink(
        _nlmsg(20, _unix_msg((kdev, 77))) + _nlmsg(20, _unix_msg(None)),
        _nlmsg(3, b"\0\0\0\0"),
    )
    assert _diag_inodes(sock) == {(os.makedev(8, 3), 77)}  # type: ignore[arg-type]
    assert len(sock.sent) == 1


@pytest.mark.parametrize(
    "reply",
    [
        b"\x08\0\0\0\x14\0\0\0\0\0\0\0\0\0\0\0",  # length below a header
        b"\xff\0\0\0\x14\0\0\0\0\0\0\0\0\0\0\0",  # length past the datagram
        b"",  # the dump ended without NLMSG_DONE
    ],
)
def test_diag_parser_refuses_malformed_replies(reply: bytes) -> None:
    with pytest.raises(OSError):
        _diag_inodes(_FakeNetlink(reply))  # type: ignore[arg-type]


def test_diag_parser_raises_on_netlink_error() -> None:
    with pytest.raises(OSError):
        _diag_inodes(_FakeNetlink(_nlmsg(2, struct.pack("<i", -errno.EPERM))))  # type: ignore[arg-type]
