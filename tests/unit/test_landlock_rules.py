"""Landlock's pure parts: rights per ABI, the plan, the rules' JSON form."""

from __future__ import annotations

import ast
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.sandbox import landlock
from corral.sandbox.landlock import (
    FS_EXECUTE,
    FS_IOCTL_DEV,
    FS_READ_DIR,
    FS_READ_FILE,
    FS_REFER,
    FS_TRUNCATE,
    FS_WRITE_FILE,
    LOG_NEW_EXEC_ON,
    NET_BIND_TCP,
    NET_CONNECT_TCP,
    SCOPE_ABSTRACT_UNIX_SOCKET,
    SCOPE_SIGNAL,
    LandlockError,
    LandlockRules,
    dump_json,
    fs_rights,
    parse_json,
    path_access,
    plan,
)

V1 = (1 << 13) - 1


def _rules(**kw: object) -> LandlockRules:
    return LandlockRules(("/usr",), ("/work",), **kw)  # type: ignore[arg-type]


# --- rights -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("abi", "rights"),
    [
        (0, 0),
        (1, V1),
        (2, V1 | FS_REFER),
        (3, V1 | FS_REFER | FS_TRUNCATE),
        (4, V1 | FS_REFER | FS_TRUNCATE),
        (5, V1 | FS_REFER | FS_TRUNCATE | FS_IOCTL_DEV),
        (6, V1 | FS_REFER | FS_TRUNCATE | FS_IOCTL_DEV),
        (7, (1 << 16) - 1),
    ],
)
def test_fs_rights_by_abi(abi: int, rights: int) -> None:
    assert fs_rights(abi) == rights


def test_v1_has_thirteen_rights() -> None:
    assert bin(fs_rights(1)).count("1") == 13


def test_files_get_file_rights_only() -> None:
    everything = fs_rights(7)
    assert path_access(everything, is_dir=True) == everything
    assert path_access(everything, is_dir=False) == (
        FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
    )
    assert (
        path_access(FS_READ_FILE | FS_READ_DIR | FS_EXECUTE, is_dir=False)
        == FS_READ_FILE | FS_EXECUTE
    )


# --- plan -------------------------------------------------------------------------


def test_plan_grants_read_exec_to_read_only_and_everything_to_read_write() -> None:
    p = plan(_rules(), 7)
    assert p.abi == 7
    assert p.handled_fs == fs_rights(7)
    assert p.paths == (("/usr", FS_READ_FILE | FS_READ_DIR | FS_EXECUTE), ("/work", fs_rights(7)))
    assert p.handled_net == 0 and p.ports == ()
    assert p.scoped == SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    assert p.restrict_flags == 0


def test_newer_kernels_are_used_at_the_highest_known_abi() -> None:
    assert plan(_rules(), 99).abi == landlock.ABI_MAX


def test_no_landlock_fails_closed() -> None:
    with pytest.raises(LandlockError) as info:
        plan(_rules(), 0)
    assert isinstance(info.value, OSError)


def test_scopes_need_abi_6() -> None:
    with pytest.raises(LandlockError, match="ABI 6"):
        plan(_rules(), 5)
    with pytest.raises(LandlockError, match="ABI 6"):
        plan(_rules(scope_abstract_unix=False), 5)
    p = plan(_rules(scope_abstract_unix=False, scope_signal=False), 5)
    assert p.scoped == 0 and p.abi == 5


def test_tcp_rules_need_abi_4_and_merge_per_port() -> None:
    with pytest.raises(LandlockError, match="ABI 4"):
        plan(_rules(scope_abstract_unix=False, scope_signal=False, tcp_connect=[443]), 3)
    p = plan(_rules(tcp_bind=[8080], tcp_connect=[443, 8080]), 7)
    assert p.handled_net == NET_BIND_TCP | NET_CONNECT_TCP
    assert p.ports == ((443, NET_CONNECT_TCP), (8080, NET_BIND_TCP | NET_CONNECT_TCP))
    p = plan(_rules(tcp_connect=[]), 7)  # connect handled, no port allowed
    assert p.handled_net == NET_CONNECT_TCP and p.ports == ()


def test_audit_flag_only_where_the_kernel_has_it() -> None:
    assert plan(_rules(log_new_exec=True), 7).restrict_flags == LOG_NEW_EXEC_ON
    assert plan(_rules(log_new_exec=True), 6).restrict_flags == 0


@pytest.mark.parametrize(("abi", "size"), [(1, 8), (3, 8), (4, 16), (5, 16), (6, 24), (7, 24)])
def test_ruleset_attr_has_the_abi_s_size(abi: int, size: int) -> None:
    rules = _rules(
        tcp_connect=[1] if abi >= 4 else None, scope_signal=abi >= 6, scope_abstract_unix=False
    )
    attr = plan(rules, abi).ruleset_attr()
    assert len(attr) == size
    assert struct.unpack_from("=Q", attr)[0] == fs_rights(abi)
    if abi >= 6:
        assert struct.unpack("=QQQ", attr)[1:] == (NET_CONNECT_TCP, SCOPE_SIGNAL)


# --- the rules object ---------------------------------------------------------------


def test_rules_are_immutable_and_comparable() -> None:
    r = _rules()
    with pytest.raises(AttributeError):
        r.read_only = ("/",)
    assert r == _rules() and hash(r) == hash(_rules())
    assert r != _rules(scope_signal=False)
    assert "read_only=('/usr',)" in repr(r)


def test_json_golden() -> None:
    r = LandlockRules(["/usr"], ["/work", "/dev/null"], log_new_exec=True, tcp_connect=[443])
    assert r.to_json() == (
        '{"read_only":["/usr"],"read_write":["/work","/dev/null"],"scope_abstract_unix":true,'
        '"scope_signal":true,"log_new_exec":true,"tcp_bind":null,"tcp_connect":[443]}'
    )
    assert LandlockRules.from_json(r.to_json()) == r
    assert json.loads(r.to_json()) == r.to_dict()


def test_json_defaults_are_the_strict_ones() -> None:
    r = LandlockRules.from_json('{"read_only": [], "read_write": ["/w"]}')
    assert (r.scope_abstract_unix, r.scope_signal, r.log_new_exec) == (True, True, False)
    assert r.tcp_bind is None and r.tcp_connect is None


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '{"read_only": []}',
        '{"read_only": [], "read_write": [], "extra": 1}',
        '{"read_only": ["usr"], "read_write": []}',
        '{"read_only": ["/a\\u0000b"], "read_write": []}',
        '{"read_only": "/usr", "read_write": []}',
        '{"read_only": [], "read_write": [], "scope_signal": 1}',
        '{"read_only": [], "read_write": [], "tcp_bind": [true]}',
        '{"read_only": [], "read_write": [], "tcp_bind": [65536]}',
        '{"read_only": [], "read_write": [], "tcp_bind": [-1]}',
        '{"read_only": [], "read_write": [], "tcp_bind": 80}',
        '{"read_only": [], "read_write": [], "tcp_bind": [80.0]}',
        '{"read_only": [], "read_only": [], "read_write": []}',
        '{"read_only": [], "read_write": []} x',
    ],
)
def test_malformed_rules_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        LandlockRules.from_json(text)


def test_paths_with_any_bytes_survive_the_round_trip() -> None:
    odd = '/w/\udcff-\u00e9-\U0001f600-"\\\n'
    r = LandlockRules([odd], [])
    assert r.to_json().isascii()
    assert LandlockRules.from_json(r.to_json()).read_only == (odd,)


# --- the JSON reader/writer against the json module ----------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(_json_values)
def test_parse_json_agrees_with_json_loads(value: object) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=2)):
        assert parse_json(text) == json.loads(text)


@given(_json_values)
def test_dump_json_is_read_back_by_json_loads(value: object) -> None:
    assert json.loads(dump_json(value)) == value
    assert parse_json(dump_json(value)) == value


MALFORMED = ["", "{", '{"a" 1}', '{"a":1,}', "[1,]", '"abc', '"\\x"', '"\\u12"', "01", "1.5"]
MALFORMED += ["1e3", "tru", '"a\nb"', "[" * 40 + "]" * 40]


@pytest.mark.parametrize("text", MALFORMED)
def test_parse_json_refuses_malformed_input(text: str) -> None:
    with pytest.raises(ValueError):
        parse_json(text)


def test_dump_json_refuses_other_types() -> None:
    with pytest.raises(TypeError):
        dump_json({1: 2})
    with pytest.raises(TypeError):
        dump_json(1.5)


# --- the module itself -----------------------------------------------------------------

ALLOWED_IMPORTS = {"__future__", "ctypes", "errno", "os", "stat", "struct", "sys"}


def test_module_uses_only_cheap_standard_modules() -> None:
    tree = ast.parse(Path(landlock.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports: the init loads the file on its own"
            imported.add((node.module or "").split(".")[0])
    assert imported <= ALLOWED_IMPORTS


def test_main_refuses_malformed_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert landlock.main(["{not json", "/bin/true"]) == landlock.EXIT_REFUSED
    assert "refusing to run /bin/true" in capsys.readouterr().err
    assert landlock.main([]) == landlock.EXIT_REFUSED
