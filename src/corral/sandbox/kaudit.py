"""Kernel audit records of Landlock and seccomp denials (docs/broker.md, "Kernel denials").

A pure, bounded core and a thin netlink shell:

- `split_netlink(buf)` cuts one datagram of the audit netlink socket into
  (type, payload) messages; `parse_record(type, payload)` turns one message
  into an `AuditRecord`, or None for anything but the four kernel types
  corral reads (SYSCALL, SECCOMP, LANDLOCK_ACCESS, LANDLOCK_DOMAIN, plus EOE
  ending an event). User-space messages (AUDIT_USER and the 1100-1199 /
  2100-2999 ranges) are never accepted, whoever sent them.
- `Correlator` groups the records of one audit event (same serial), and
  attributes each denial to a sandbox by the cgroup of a pid in the event
  (the SYSCALL record's, the SECCOMP record's) or, when that process is
  already gone, by the cgroup its Landlock domain's creator had when the
  domain was first reported (corral's init, alive for the sandbox's life).
- `AuditSocket` is the shell: NETLINK_AUDIT bound to the AUDIT_NLGRP_READLOG
  multicast group (needs CAP_AUDIT_READ); `audit_enabled()` / `set_audit_enabled()`
  ask and set the kernel's flag (corral itself only asks; tests set it).

Every field of a record past the kernel's own ones is sandbox-controlled text
(a path, a comm): values are decoded as the kernel encodes them (quoted, or
hex when unsafe) and returned as bytes; callers sanitize before showing them.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "AUDIT_EOE",
    "AUDIT_LANDLOCK_ACCESS",
    "AUDIT_LANDLOCK_DOMAIN",
    "AUDIT_SECCOMP",
    "AUDIT_SYSCALL",
    "MAX_PAYLOAD",
    "AuditRecord",
    "AuditSocket",
    "Correlator",
    "KernelDenial",
    "audit_enabled",
    "cgroup_paths",
    "in_cgroup",
    "parse_record",
    "proc_cgroup",
    "set_audit_enabled",
    "split_netlink",
]

NETLINK_AUDIT = 9
AUDIT_NLGRP_READLOG = 1
AUDIT_GET = 1000
AUDIT_SET = 1001
AUDIT_USER = 1005
AUDIT_SYSCALL = 1300
AUDIT_EOE = 1320
AUDIT_SECCOMP = 1326
AUDIT_LANDLOCK_ACCESS = 1423
AUDIT_LANDLOCK_DOMAIN = 1424
_ACCEPTED = frozenset(
    {AUDIT_SYSCALL, AUDIT_EOE, AUDIT_SECCOMP, AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN}
)
#: MAX_AUDIT_MESSAGE_LENGTH in the kernel; anything longer is not a kernel record.
MAX_PAYLOAD = 8970
_MAX_FIELDS = 64
_MAX_PENDING_EVENTS = 64
_MAX_DOMAINS = 4096
_NLMSG_HDR = struct.Struct("=IHHII")
#: Fields the kernel writes with audit_log_untrustedstring (quoted or hex).
_UNTRUSTED = frozenset({"path", "name", "comm", "exe", "proctitle"})


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One kernel audit record: its type, event serial and key=value fields (bytes)."""

    type: int
    serial: int
    fields: dict[str, bytes] = field(hash=False)

    def int_field(self, key: str, base: int = 10) -> int | None:
        raw = self.fields.get(key)
        if raw is None or not raw or len(raw) > 20:
            return None
        try:
            return int(raw.decode("ascii"), base)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class KernelDenial:
    """A denial the kernel reported: `kind` landlock (access = the Landlock
    blockers, e.g. fs.write_file; target = the path as raw bytes) or seccomp
    (access = the syscall number as text; target = b"")."""

    kind: str
    access: str
    target: bytes
    pid: int | None
    domain: str | None
    syscall: int | None
    serial: int


def split_netlink(buf: bytes) -> list[tuple[int, bytes]]:
    """The (type, payload) of each netlink message in `buf`; a malformed tail is dropped."""
    out: list[tuple[int, bytes]] = []
    off = 0
    while off + _NLMSG_HDR.size <= len(buf):
        length, mtype, _flags, _seq, _pid = _NLMSG_HDR.unpack_from(buf, off)
        if length < _NLMSG_HDR.size or off + length > len(buf):
            # The kernel's audit multicast sends one message per datagram and
            # sets nlmsg_len to the payload length without padding: accept a
            # short length as long as it fits.
            break
        out.append((mtype, bytes(buf[off + _NLMSG_HDR.size : off + length])))
        off += (length + 3) & ~3
    return out


def _decode_value(raw: bytes) -> bytes | None:
    # audit_log_untrustedstring: quoted when every byte is printable and not
    # a quote or space, else the whole value as upper-case hex, unquoted.
    if raw.startswith(b'"'):
        if len(raw) < 2 or not raw.endswith(b'"') or b'"' in raw[1:-1]:
            return None
        return raw[1:-1]
    return raw


def _hex_or_plain(raw: bytes) -> bytes:
    if raw and len(raw) % 2 == 0 and all(c in b"0123456789ABCDEF" for c in raw):
        try:
            return bytes.fromhex(raw.decode("ascii"))
        except ValueError:
            return raw
    return raw


def parse_record(mtype: int, payload: bytes) -> AuditRecord | None:
    """The record in one audit message, or None when it is not one corral reads.

    Pure and bounded: at most MAX_PAYLOAD bytes and _MAX_FIELDS fields are
    looked at; the first occurrence of a key wins; a malformed record is None.
    """
    if mtype not in _ACCEPTED or len(payload) > MAX_PAYLOAD:
        return None
    text = payload.rstrip(b"\x00\n")
    if not text.startswith(b"audit("):
        return None
    end = text.find(b"): ")
    if end < 0:
        end = text.find(b"):")
        if end < 0 or end + 2 != len(text):
            return None
    stamp = text[6:end]
    _, sep, serial_raw = stamp.partition(b":")
    if not sep or not serial_raw.isdigit() or len(serial_raw) > 20:
        return None
    fields: dict[str, bytes] = {}
    for token in text[end + 3 :].split(b" ")[:_MAX_FIELDS]:
        key, eq, value = token.partition(b"=")
        if not eq or not key or len(key) > 32 or not key.replace(b"_", b"").isalnum():
            continue
        decoded = _decode_value(value)
        if decoded is None:
            continue
        name = key.decode("ascii")
        if name not in fields:
            hexed = name in _UNTRUSTED and not value.startswith(b'"')
            fields[name] = _hex_or_plain(decoded) if hexed else decoded
    return AuditRecord(mtype, int(serial_raw), fields)


def proc_cgroup(pid: int) -> tuple[str, ...] | None:
    """The cgroup paths of `pid` (one per hierarchy line), None when it is gone."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as fh:
            data = fh.read(16384)
    except OSError:
        return None
    return cgroup_paths(data)


def cgroup_paths(data: bytes) -> tuple[str, ...]:
    """The path field of each `/proc/PID/cgroup` line (pure)."""
    out: list[str] = []
    for line in data.splitlines()[:64]:
        parts = line.split(b":", 2)
        if len(parts) == 3 and parts[2].startswith(b"/"):
            out.append(os.fsdecode(parts[2]).strip("/"))
    return tuple(out)


def in_cgroup(paths: Iterable[str], relpath: str) -> bool:
    """Whether any of `paths` is `relpath` or below it."""
    rel = relpath.strip("/")
    return bool(rel) and any(p == rel or p.startswith(rel + "/") for p in paths)


@dataclass
class _Event:
    serial: int
    denials: list[AuditRecord] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)


class Correlator:
    """Groups records by event and attributes denials to sandboxes (pure but for `lookup`).

    `lookup(pid)` returns the pid's cgroup paths (None when gone); it is
    called as soon as a record naming the pid arrives, because the process
    may exit at any moment. `feed` returns the denials of every event that
    is complete, each with the cgroup paths it was attributed to (None when
    nothing could be attributed).
    """

    def __init__(self, lookup: Callable[[int], tuple[str, ...] | None]) -> None:
        self._lookup = lookup
        self._events: dict[int, _Event] = {}
        self._paths: dict[int, tuple[str, ...]] = {}
        self._domains: dict[str, tuple[str, ...]] = {}

    def feed(self, rec: AuditRecord) -> list[tuple[KernelDenial, tuple[str, ...] | None]]:
        out: list[tuple[KernelDenial, tuple[str, ...] | None]] = []
        # Records of one event arrive together; a new serial ends the older ones.
        for serial in [s for s in self._events if s != rec.serial]:
            out += self._finish(serial)
        ev = self._events.setdefault(rec.serial, _Event(rec.serial))
        pid = rec.int_field("pid")
        if rec.type in (AUDIT_SYSCALL, AUDIT_SECCOMP) and pid is not None and pid > 0:
            ev.pids.append(pid)
            self._remember(pid)
        if rec.type == AUDIT_LANDLOCK_DOMAIN:
            domain = _domain_id(rec)
            if (
                domain is not None
                and pid is not None
                and pid > 0
                and rec.fields.get("status") == b"allocated"
            ):
                paths = self._lookup(pid)
                if paths is not None and len(self._domains) < _MAX_DOMAINS:
                    self._domains[domain] = paths
        if rec.type in (AUDIT_LANDLOCK_ACCESS, AUDIT_SECCOMP):
            ev.denials.append(rec)
        if rec.type == AUDIT_EOE:
            out += self._finish(rec.serial)
        while len(self._events) > _MAX_PENDING_EVENTS:
            out += self._finish(next(iter(self._events)))
        return out

    def flush(self) -> list[tuple[KernelDenial, tuple[str, ...] | None]]:
        out: list[tuple[KernelDenial, tuple[str, ...] | None]] = []
        for serial in list(self._events):
            out += self._finish(serial)
        return out

    def _remember(self, pid: int) -> None:
        if pid not in self._paths:
            paths = self._lookup(pid)
            if paths is not None:
                self._paths[pid] = paths

    def _finish(self, serial: int) -> list[tuple[KernelDenial, tuple[str, ...] | None]]:
        ev = self._events.pop(serial, None)
        if ev is None:
            return []
        pid_paths = next((self._paths[p] for p in ev.pids if p in self._paths), None)
        pid = ev.pids[0] if ev.pids else None
        out: list[tuple[KernelDenial, tuple[str, ...] | None]] = []
        for rec in ev.denials:
            if rec.type == AUDIT_SECCOMP:
                nr = rec.int_field("syscall")
                own = rec.int_field("pid")
                paths = self._paths.get(own) if own is not None else None
                out.append(
                    (
                        KernelDenial(
                            "seccomp",
                            "" if nr is None else str(nr),
                            b"",
                            own,
                            None,
                            nr,
                            serial,
                        ),
                        paths or pid_paths,
                    )
                )
            else:
                domain = _domain_id(rec)
                blockers = rec.fields.get("blockers", b"?")
                target = rec.fields.get("path") or rec.fields.get("name") or b""
                paths = pid_paths or (self._domains.get(domain) if domain else None)
                out.append(
                    (
                        KernelDenial(
                            "landlock",
                            blockers.decode("ascii", "replace")[:128],
                            target[:4096],
                            pid,
                            domain,
                            None,
                            serial,
                        ),
                        paths,
                    )
                )
        self._paths.clear()
        return out


def _domain_id(rec: AuditRecord) -> str | None:
    raw = rec.fields.get("domain")
    if raw is None or not 0 < len(raw) <= 16 or not all(c in b"0123456789abcdef" for c in raw):
        return None
    return raw.decode("ascii")


# --- the shell ----------------------------------------------------------------


def _status(sock: socket.socket) -> tuple[int, ...]:
    sock.send(_NLMSG_HDR.pack(16, AUDIT_GET, 1, 1, 0))
    while True:
        data = sock.recv(8192)
        for mtype, payload in split_netlink(data):
            if mtype == AUDIT_GET and len(payload) >= 8:
                return struct.unpack_from(f"={len(payload) // 4}I", payload)
            if mtype == 2 and len(payload) >= 4:  # NLMSG_ERROR
                err = -struct.unpack_from("=i", payload)[0]
                if err:
                    raise OSError(err, f"AUDIT_GET: {os.strerror(err)}")


def audit_enabled() -> bool | None:
    """Whether kernel audit is on; None when it cannot be asked (no audit, no CAP_AUDIT_CONTROL)."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT) as s:
            s.settimeout(1.0)
            values = _status(s)
    except OSError:
        return None
    return bool(values[1])


def set_audit_enabled(enabled: bool) -> None:
    """Set the kernel's audit `enabled` flag (CAP_AUDIT_CONTROL); raises OSError on refusal."""
    body = struct.pack("=10I", 1, int(enabled), 0, 0, 0, 0, 0, 0, 0, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT) as s:
        s.settimeout(2.0)
        s.send(_NLMSG_HDR.pack(16 + len(body), AUDIT_SET, 5, 2, 0) + body)
        for mtype, payload in split_netlink(s.recv(8192)):
            if mtype == 2 and len(payload) >= 4:
                err = -struct.unpack_from("=i", payload)[0]
                if err:
                    raise OSError(err, f"AUDIT_SET: {os.strerror(err)}")
        if bool(_status(s)[1]) != enabled:
            raise OSError(0, "AUDIT_SET: the kernel did not take the new state")


class AuditSocket:
    """The audit multicast group as a socket (CAP_AUDIT_READ); `close()` releases it."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)
        try:
            self._sock.bind((0, 1 << (AUDIT_NLGRP_READLOG - 1)))
            # Bursts of denials must not be lost while the reader is busy.
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        except OSError:
            self._sock.close()
            raise

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self, timeout_s: float) -> list[AuditRecord]:
        """The accepted records of one datagram (waiting up to `timeout_s`), [] on timeout."""
        self._sock.settimeout(timeout_s)
        try:
            data, addr = self._sock.recvfrom(65536)
        except TimeoutError:
            return []
        # Only the kernel (port id 0) sends on the multicast group.
        if not isinstance(addr, tuple) or addr[0] != 0:
            return []
        out: list[AuditRecord] = []
        for mtype, payload in split_netlink(data):
            rec = parse_record(mtype, payload)
            if rec is not None:
                out.append(rec)
        return out

    def close(self) -> None:
        self._sock.close()
