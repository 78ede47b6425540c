"""Landlock for the sandbox's init: standard library only, quick to import.

The in-sandbox init runs as `/usr/bin/python3 -I -S` (no site-packages), so
this module imports nothing from corral and none of the slow standard modules
(`json`, `dataclasses`, `typing`, `re` cost 6-20 ms each on this machine):
it carries its own ctypes layer and a strict JSON reader for its rules.

- `LandlockRules` is the pure, immutable description; `to_json()` /
  `from_json()` carry it on the init's argv.
- `plan(rules, abi)` decides the ruleset for a kernel ABI (pure).
- `apply(rules)` enforces it on the calling thread and returns the ABI used;
  any failure raises `LandlockError` and nothing is half-applied that the
  caller could mistake for success (fail closed).

Access granted per path (only rights the kernel's ABI handles):
read-only -> READ_FILE | READ_DIR | EXECUTE; read-write -> every handled right;
a path that is not a directory gets only the file rights (EXECUTE, WRITE_FILE,
READ_FILE, TRUNCATE, IOCTL_DEV), because the kernel rejects directory rights on
it. A path that does not exist is skipped; one that exists but cannot be opened
is an error.

Run as a script, `python3 -I -S landlock.py RULES_JSON CMD [ARG...]` applies
the rules and executes CMD (exit 125 when the rules cannot be applied).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import sys

__all__ = [
    "ABI_MAX",
    "EXIT_REFUSED",
    "FILE_RIGHTS",
    "FS_EXECUTE",
    "FS_IOCTL_DEV",
    "FS_READ_DIR",
    "FS_READ_FILE",
    "FS_REFER",
    "FS_TRUNCATE",
    "FS_WRITE_FILE",
    "LOG_NEW_EXEC_ON",
    "NET_BIND_TCP",
    "NET_CONNECT_TCP",
    "READ_ONLY_RIGHTS",
    "SCOPE_ABSTRACT_UNIX_SOCKET",
    "SCOPE_SIGNAL",
    "LandlockError",
    "LandlockRules",
    "Plan",
    "abi_version",
    "apply",
    "dump_json",
    "fs_rights",
    "main",
    "nest",
    "nested_plan",
    "parse_json",
    "path_access",
    "plan",
]

# The highest ABI this module knows; a newer kernel is used at this level.
ABI_MAX = 7
EXIT_REFUSED = 125

# include/uapi/linux/landlock.h
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6
LOG_SAME_EXEC_OFF = 1 << 0  # ABI 7, landlock_restrict_self() flags
LOG_NEW_EXEC_ON = 1 << 1
LOG_SUBDOMAINS_OFF = 1 << 2

_FS_V1 = (1 << 13) - 1
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_ONLY_RIGHTS = FS_READ_FILE | FS_READ_DIR | FS_EXECUTE

# Same numbers on every architecture (syscalls >= 424 are unified).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int


class LandlockError(OSError):
    """Landlock is unavailable or could not be applied; the command must not run."""


# --- the pure description -----------------------------------------------------

_KEYS = (
    "read_only",
    "read_write",
    "scope_abstract_unix",
    "scope_signal",
    "log_new_exec",
    "tcp_bind",
    "tcp_connect",
)


class LandlockRules:
    """What a sandboxed process may touch, as Landlock sees it (immutable).

    `read_only` / `read_write`: absolute paths inside the sandbox.
    `scope_abstract_unix`: no connecting to abstract unix sockets created
    outside the domain. `scope_signal`: no signals to processes outside it.
    `log_new_exec`: audit denials also after the next execve (ABI 7; ignored
    below). `tcp_bind` / `tcp_connect`: None leaves TCP alone (the network
    namespace is the network boundary); a tuple restricts bind/connect to
    those ports (ABI 4).

    JSON form (all keys but the first two optional, unknown keys refused):
    {"read_only": [str], "read_write": [str], "scope_abstract_unix": bool,
     "scope_signal": bool, "log_new_exec": bool, "tcp_bind": [int] | null,
     "tcp_connect": [int] | null}
    """

    __slots__ = (
        "log_new_exec",
        "read_only",
        "read_write",
        "scope_abstract_unix",
        "scope_signal",
        "tcp_bind",
        "tcp_connect",
    )

    read_only: tuple[str, ...]
    read_write: tuple[str, ...]
    scope_abstract_unix: bool
    scope_signal: bool
    log_new_exec: bool
    tcp_bind: tuple[int, ...] | None
    tcp_connect: tuple[int, ...] | None

    def __init__(
        self,
        read_only: tuple[str, ...] | list[str],
        read_write: tuple[str, ...] | list[str],
        *,
        scope_abstract_unix: bool = True,
        scope_signal: bool = True,
        log_new_exec: bool = False,
        tcp_bind: tuple[int, ...] | list[int] | None = None,
        tcp_connect: tuple[int, ...] | list[int] | None = None,
    ) -> None:
        values = (
            ("read_only", _paths("read_only", read_only)),
            ("read_write", _paths("read_write", read_write)),
            ("scope_abstract_unix", _flag("scope_abstract_unix", scope_abstract_unix)),
            ("scope_signal", _flag("scope_signal", scope_signal)),
            ("log_new_exec", _flag("log_new_exec", log_new_exec)),
            ("tcp_bind", _ports("tcp_bind", tcp_bind)),
            ("tcp_connect", _ports("tcp_connect", tcp_connect)),
        )
        for name, value in values:
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"LandlockRules is immutable (cannot set {name})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"LandlockRules is immutable (cannot delete {name})")

    def _astuple(self) -> tuple[object, ...]:
        return tuple(getattr(self, k) for k in _KEYS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LandlockRules):
            return NotImplemented
        return self._astuple() == other._astuple()

    def __hash__(self) -> int:
        return hash(self._astuple())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={getattr(self, k)!r}" for k in _KEYS)
        return f"LandlockRules({inner})"

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for k in _KEYS:
            v = getattr(self, k)
            out[k] = list(v) if isinstance(v, tuple) else v
        return out

    def to_json(self) -> str:
        """Compact JSON, ASCII only (safe on argv whatever the path bytes)."""
        return dump_json(self.to_dict())

    @classmethod
    def from_dict(cls, obj: object) -> LandlockRules:
        """Build from the JSON-shaped dict; raises ValueError on anything unexpected."""
        if not isinstance(obj, dict):
            raise ValueError("Landlock rules must be a JSON object")
        unknown = sorted(set(obj) - set(_KEYS))
        if unknown:
            raise ValueError(f"unknown Landlock rule keys: {', '.join(map(str, unknown))}")
        for required in ("read_only", "read_write"):
            if required not in obj:
                raise ValueError(f"Landlock rules lack {required}")
        return cls(
            _paths("read_only", _list_of(obj["read_only"], "read_only")),
            _paths("read_write", _list_of(obj["read_write"], "read_write")),
            scope_abstract_unix=_flag("scope_abstract_unix", obj.get("scope_abstract_unix", True)),
            scope_signal=_flag("scope_signal", obj.get("scope_signal", True)),
            log_new_exec=_flag("log_new_exec", obj.get("log_new_exec", False)),
            tcp_bind=_ports("tcp_bind", _opt_list_of(obj.get("tcp_bind"), "tcp_bind")),
            tcp_connect=_ports("tcp_connect", _opt_list_of(obj.get("tcp_connect"), "tcp_connect")),
        )

    @classmethod
    def from_json(cls, text: str) -> LandlockRules:
        """Parse `to_json()` output (any equivalent JSON); ValueError if malformed."""
        return cls.from_dict(parse_json(text))


def _list_of(v: object, name: str) -> list[object]:
    if not isinstance(v, list):
        raise ValueError(f"{name} must be a list")
    return v


def _opt_list_of(v: object, name: str) -> list[object] | None:
    return None if v is None else _list_of(v, name)


def _paths(name: str, paths: object) -> tuple[str, ...]:
    if not isinstance(paths, (list, tuple)):
        raise ValueError(f"{name} must be a list of paths")
    out: list[str] = []
    for p in paths:
        if not isinstance(p, str) or not p.startswith("/") or "\0" in p:
            raise ValueError(f"{name}: {p!r} is not an absolute path")
        out.append(p)
    return tuple(out)


def _flag(name: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be true or false")
    return v


def _ports(name: str, ports: object) -> tuple[int, ...] | None:
    if ports is None:
        return None
    if not isinstance(ports, (list, tuple)):
        raise ValueError(f"{name} must be a list of ports or null")
    out: list[int] = []
    for p in ports:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 65535:
            raise ValueError(f"{name}: {p!r} is not a TCP port")
        out.append(p)
    return tuple(out)


# --- the plan (pure) ----------------------------------------------------------


def fs_rights(abi: int) -> int:
    """Every filesystem right the kernel handles at Landlock ABI `abi`."""
    if abi < 1:
        return 0
    rights = _FS_V1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def path_access(wanted: int, is_dir: bool) -> int:
    """The rights a path rule may carry: directory rights only on directories."""
    return wanted if is_dir else wanted & FILE_RIGHTS


class Plan:
    """A ruleset decided for one ABI: what to handle and what to allow where."""

    __slots__ = ("abi", "handled_fs", "handled_net", "paths", "ports", "restrict_flags", "scoped")

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int
    restrict_flags: int
    paths: tuple[tuple[str, int], ...]
    ports: tuple[tuple[int, int], ...]

    def __init__(
        self,
        *,
        abi: int,
        handled_fs: int,
        handled_net: int,
        scoped: int,
        restrict_flags: int,
        paths: tuple[tuple[str, int], ...],
        ports: tuple[tuple[int, int], ...],
    ) -> None:
        self.abi = abi
        self.handled_fs = handled_fs
        self.handled_net = handled_net
        self.scoped = scoped
        self.restrict_flags = restrict_flags
        self.paths = paths
        self.ports = ports

    def ruleset_attr(self) -> bytes:
        """struct landlock_ruleset_attr, as long as this ABI knows it."""
        if self.abi >= 6:
            return struct.pack("=QQQ", self.handled_fs, self.handled_net, self.scoped)
        if self.abi >= 4:
            return struct.pack("=QQ", self.handled_fs, self.handled_net)
        return struct.pack("=Q", self.handled_fs)


def plan(rules: LandlockRules, abi: int) -> Plan:
    """Decide the ruleset for kernel ABI `abi` (capped at ABI_MAX).

    Raises LandlockError when Landlock is unavailable (abi < 1) or when the
    rules ask for a restriction this ABI cannot enforce (scopes below 6, TCP
    below 4). Audit logging is not a restriction: below ABI 7 it is dropped.
    """
    if abi < 1:
        raise LandlockError(errno.EOPNOTSUPP, "Landlock is not available in this kernel")
    abi = min(abi, ABI_MAX)
    handled_fs = fs_rights(abi)
    paths = [(p, READ_ONLY_RIGHTS & handled_fs) for p in rules.read_only]
    paths += [(p, handled_fs) for p in rules.read_write]

    handled_net = 0
    ports: dict[int, int] = {}
    for which, right in ((rules.tcp_bind, NET_BIND_TCP), (rules.tcp_connect, NET_CONNECT_TCP)):
        if which is None:
            continue
        if abi < 4:
            raise LandlockError(
                errno.EOPNOTSUPP, f"TCP rules need Landlock ABI 4, kernel has {abi}"
            )
        handled_net |= right
        for port in which:
            ports[port] = ports.get(port, 0) | right

    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET if rules.scope_abstract_unix else 0) | (
        SCOPE_SIGNAL if rules.scope_signal else 0
    )
    if scoped and abi < 6:
        raise LandlockError(errno.EOPNOTSUPP, f"Landlock scopes need ABI 6, kernel has {abi}")
    flags = LOG_NEW_EXEC_ON if rules.log_new_exec and abi >= 7 else 0
    return Plan(
        abi=abi,
        handled_fs=handled_fs,
        handled_net=handled_net,
        scoped=scoped,
        restrict_flags=flags,
        paths=tuple(paths),
        ports=tuple(sorted(ports.items())),
    )


def nested_plan(outer: Plan) -> Plan:
    """The ruleset of the command's own domain, nested in the init's `outer` (pure).

    Its only purpose is to be a separate, deeper domain: Landlock refuses
    ptrace-mode access (ptrace, /proc/<pid>/mem, /proc/<pid>/fd) to a process
    outside the caller's domain and its descendants, and `outer.scoped`
    (SCOPE_SIGNAL) refuses signals the same way, so the init stays out of the
    command's reach. A ruleset must handle something: MAKE_BLOCK, with no
    rule allowing it, costs nothing (nothing in a sandbox creates block devices).
    """
    return Plan(
        abi=outer.abi,
        handled_fs=FS_MAKE_BLOCK,
        handled_net=0,
        scoped=outer.scoped if outer.abi >= 6 else 0,
        restrict_flags=outer.restrict_flags,
        paths=(),
        ports=(),
    )


# --- the kernel interface -----------------------------------------------------


def _fail(what: str) -> LandlockError:
    err = ctypes.get_errno()
    return LandlockError(err, f"{what}: {os.strerror(err)}")


def abi_version() -> int:
    """The kernel's Landlock ABI, or 0 when Landlock is not available."""
    ret = _syscall(
        ctypes.c_long(_SYS_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(_CREATE_RULESET_VERSION),
    )
    return max(int(ret), 0)


def apply(rules: LandlockRules) -> int:
    """Restrict the calling thread (and all it later starts) to `rules`; return the ABI used.

    Sets no_new_privs first. Landlock binds only the calling thread: call this
    before any other thread exists. Raises LandlockError on any failure; the
    caller must then not run the command.
    """
    p = plan(rules, abi_version())
    ruleset_fd = _create_ruleset(p, "")
    try:
        for path, wanted in p.paths:
            _add_path_rule(ruleset_fd, path, wanted)
        for port, access in p.ports:
            buf = ctypes.create_string_buffer(struct.pack("=QQ", access, port), 16)
            if _add_rule(ruleset_fd, _RULE_NET_PORT, buf) < 0:
                raise _fail(f"landlock_add_rule(port {port})")
        if (
            _prctl(
                _PR_SET_NO_NEW_PRIVS,
                ctypes.c_ulong(1),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
            )
            != 0
        ):
            raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
        _restrict_self(ruleset_fd, p, "")
    finally:
        os.close(ruleset_fd)
    return p.abi


def nest(rules: LandlockRules) -> None:
    """Enter `nested_plan` of `rules` below the current domain (after `apply`).

    Call it in the forked child that execs the command, never in the init.
    no_new_privs is inherited from `apply`. Raises LandlockError on failure.
    """
    p = nested_plan(plan(rules, abi_version()))
    ruleset_fd = _create_ruleset(p, "(nested)")
    try:
        _restrict_self(ruleset_fd, p, "(nested)")
    finally:
        os.close(ruleset_fd)


def _create_ruleset(p: Plan, what: str) -> int:
    attr = p.ruleset_attr()
    attr_buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset_fd = int(
        _syscall(
            ctypes.c_long(_SYS_CREATE_RULESET),
            attr_buf,
            ctypes.c_size_t(len(attr)),
            ctypes.c_uint32(0),
        )
    )
    if ruleset_fd < 0:
        raise _fail("landlock_create_ruleset" + what)
    return ruleset_fd


def _restrict_self(ruleset_fd: int, p: Plan, what: str) -> None:
    if (
        _syscall(
            ctypes.c_long(_SYS_RESTRICT_SELF),
            ctypes.c_int(ruleset_fd),
            ctypes.c_uint32(p.restrict_flags),
        )
        != 0
    ):
        raise _fail("landlock_restrict_self" + what)


def _add_rule(ruleset_fd: int, rule_type: int, buf: ctypes.Array[ctypes.c_char]) -> int:
    return int(
        _syscall(
            ctypes.c_long(_SYS_ADD_RULE),
            ctypes.c_int(ruleset_fd),
            ctypes.c_int(rule_type),
            buf,
            ctypes.c_uint32(0),
        )
    )


def _add_path_rule(ruleset_fd: int, path: str, wanted: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        raise LandlockError(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
    try:
        access = path_access(wanted, stat.S_ISDIR(os.fstat(fd).st_mode))
        if access == 0:
            return
        # struct landlock_path_beneath_attr is packed: u64 then s32, 12 bytes.
        buf = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        if _add_rule(ruleset_fd, _RULE_PATH_BENEATH, buf) < 0:
            raise _fail(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


# --- a strict JSON reader and writer (the `json` module costs 8 ms to import) --

_WS = " \t\n\r"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_MAX_DEPTH = 32


def parse_json(text: str) -> object:
    """Parse JSON made of objects, arrays, strings, integers, booleans and null.

    Stricter than `json.loads`: floats, duplicate keys and nesting deeper than
    32 are refused with ValueError; the result equals `json.loads(text)`.
    """
    value, pos = _value(text, _skip(text, 0), 0)
    if _skip(text, pos) != len(text):
        raise ValueError(f"JSON: unexpected data at offset {pos}")
    return value


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _value(s: str, i: int, depth: int) -> tuple[object, int]:
    if depth > _MAX_DEPTH:
        raise ValueError("JSON: nested too deeply")
    c = s[i : i + 1]
    if c == "{":
        obj: dict[str, object] = {}
        i = _skip(s, i + 1)
        if s[i : i + 1] == "}":
            return obj, i + 1
        while True:
            if s[i : i + 1] != '"':
                raise ValueError(f"JSON: expected a key at offset {i}")
            key, i = _string(s, i)
            i = _skip(s, i)
            if s[i : i + 1] != ":":
                raise ValueError(f"JSON: expected ':' at offset {i}")
            if key in obj:
                raise ValueError(f"JSON: duplicate key {key!r}")
            obj[key], i = _value(s, _skip(s, i + 1), depth + 1)
            i = _skip(s, i)
            c = s[i : i + 1]
            if c == "}":
                return obj, i + 1
            if c != ",":
                raise ValueError(f"JSON: expected ',' or '}}' at offset {i}")
            i = _skip(s, i + 1)
    if c == "[":
        arr: list[object] = []
        i = _skip(s, i + 1)
        if s[i : i + 1] == "]":
            return arr, i + 1
        while True:
            item, i = _value(s, i, depth + 1)
            arr.append(item)
            i = _skip(s, i)
            c = s[i : i + 1]
            if c == "]":
                return arr, i + 1
            if c != ",":
                raise ValueError(f"JSON: expected ',' or ']' at offset {i}")
            i = _skip(s, i + 1)
    if c == '"':
        return _string(s, i)
    if c and c in "-0123456789":
        return _integer(s, i)
    for word, val in (("true", True), ("false", False), ("null", None)):
        if s.startswith(word, i):
            return val, i + len(word)
    raise ValueError(f"JSON: unexpected {c or 'end of input'!r} at offset {i}")


def _integer(s: str, i: int) -> tuple[int, int]:
    j = i + 1 if s[i] == "-" else i
    k = j
    while k < len(s) and "0" <= s[k] <= "9":
        k += 1
    digits = s[j:k]
    if not digits or (len(digits) > 1 and digits[0] == "0"):
        raise ValueError(f"JSON: bad number at offset {i}")
    if s[k : k + 1] in (".", "e", "E"):
        raise ValueError(f"JSON: only integers are accepted (offset {i})")
    return int(s[i:k]), k


def _string(s: str, i: int) -> tuple[str, int]:
    out: list[str] = []
    i += 1
    n = len(s)
    while True:
        j = i
        while j < n and s[j] != '"' and s[j] != "\\" and s[j] >= " ":
            j += 1
        out.append(s[i:j])
        if j >= n:
            raise ValueError("JSON: unterminated string")
        c = s[j]
        if c == '"':
            return "".join(out), j + 1
        if c != "\\":
            raise ValueError(f"JSON: control character in string at offset {j}")
        esc = s[j + 1 : j + 2]
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
            i = j + 2
            continue
        if esc != "u":
            raise ValueError(f"JSON: bad escape at offset {j}")
        code = _hex4(s, j + 2)
        i = j + 6
        if 0xD800 <= code < 0xDC00 and s[i : i + 2] == "\\u":
            low = _hex4(s, i + 2)
            if 0xDC00 <= low < 0xE000:
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                i += 6
        out.append(chr(code))


def _hex4(s: str, i: int) -> int:
    h = s[i : i + 4]
    if len(h) != 4 or any(c not in "0123456789abcdefABCDEF" for c in h):
        raise ValueError(f"JSON: bad \\u escape at offset {i}")
    return int(h, 16)


def dump_json(value: object) -> str:
    """Compact ASCII JSON for the types `parse_json` reads (dict keys must be str)."""
    parts: list[str] = []
    _dump(value, parts)
    return "".join(parts)


def _dump(v: object, out: list[str]) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        out.append(str(int(v)))
    elif isinstance(v, str):
        _dump_str(v, out)
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for n, item in enumerate(v):
            if n:
                out.append(",")
            _dump(item, out)
        out.append("]")
    elif isinstance(v, dict):
        out.append("{")
        for n, (k, item) in enumerate(v.items()):
            if not isinstance(k, str):
                raise TypeError(f"JSON object keys must be str, not {type(k).__name__}")
            if n:
                out.append(",")
            _dump_str(k, out)
            out.append(":")
            _dump(item, out)
        out.append("}")
    else:
        raise TypeError(f"cannot encode {type(v).__name__} as JSON")


def _dump_str(s: str, out: list[str]) -> None:
    out.append('"')
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        elif o > 0xFFFF:
            o -= 0x10000
            out.append(f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}")
        else:
            out.append(f"\\u{o:04x}")
    out.append('"')


# --- script entry -------------------------------------------------------------


def main(argv: list[str]) -> int:
    """`landlock.py RULES_JSON CMD [ARG...]`: apply, then exec CMD (125 if refused)."""
    if len(argv) < 2:
        sys.stderr.write("usage: landlock.py RULES_JSON CMD [ARG...]\n")
        return EXIT_REFUSED
    try:
        apply(LandlockRules.from_json(argv[0]))
    except (LandlockError, ValueError) as exc:
        sys.stderr.write(f"corral-landlock: refusing to run {argv[1]}: {exc}\n")
        return EXIT_REFUSED
    try:
        os.execvp(argv[1], argv[1:])
    except OSError as exc:
        sys.stderr.write(f"corral-landlock: {argv[1]}: {exc.strerror}\n")
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
