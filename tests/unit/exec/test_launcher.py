"""The launcher's pure parts: request bounds, the source-tree watch, socket directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.errors import UsageError
from corral.exec import launcher
from corral.exec.launcher import MAX_BODY, MAX_FIELDS, LaunchRequestError, TreeWatch, parse_request
from corral.exec.sockdirs import launcher_dir, refuse_socket_dirs


def _body(*fields: str) -> bytes:
    return b"".join(f.encode() + b"\0" for f in fields)


def test_a_request_decodes() -> None:
    req = parse_request(
        _body(launcher.BUILD_ID, "27", "7:1024:-1,4:0:0", "3", "exec", "--", "true", "A=1", "B=x"),
        4,
    )
    assert req.rlimits == ((7, 1024, -1), (4, 0, 0))
    assert req.argv == ("exec", "--", "true")
    assert req.umask == 0o27
    assert req.env == (("A", "1"), ("B", "x"))
    assert req.build_id == launcher.BUILD_ID


@pytest.mark.parametrize(
    ("body", "nfds", "why"),
    [
        (_body("id", "22", "", "1", "exec"), 3, "descriptors"),
        (_body("id", "22", "", "1", "exec"), 5, "descriptors"),
        (_body("id", "22", "", "1", "exec")[:-1], 4, "NUL"),
        (_body("id", "22", "", "1", "run"), 4, "only"),
        (_body("id", "22", "", "9", "exec"), 4, "argc"),
        (_body("id", "22", "", "0", "exec"), 4, "argc"),
        (_body("id", "x", "", "1", "exec"), 4, "umask"),
        (_body("id", "7777", "", "1", "exec"), 4, "umask"),
        (_body("id", "22"), 4, "short"),
        (_body("id", "22", "7:x:1", "1", "exec"), 4, "rlimits"),
        (_body("id", "22", "99:1:1", "1", "exec"), 4, "rlimits"),
        (b"x" * (MAX_BODY + 1), 4, "long"),
        (_body("id", "22", "", "1", "exec", *(["A=1"] * MAX_FIELDS)), 4, "fields"),
    ],
)
def test_bad_requests_are_refused(body: bytes, nfds: int, why: str) -> None:
    with pytest.raises(LaunchRequestError, match=why):
        parse_request(body, nfds)


def _tree(tmp_path: Path) -> Path:
    pkg = tmp_path / "corral" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("x = 1\n")
    (tmp_path / "corral" / "__init__.py").write_text("")
    return tmp_path


@pytest.mark.parametrize("change", ["edit", "add", "remove", "touch"])
@pytest.mark.parametrize("inotify", [True, False])
def test_the_tree_watch_sees_every_change(
    tmp_path: Path, change: str, inotify: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path)
    if not inotify:

        def no_inotify(self: TreeWatch) -> int:
            raise OSError(28, "no watches left")

        monkeypatch.setattr(TreeWatch, "_inotify", no_inotify)
    watch = TreeWatch(str(root))
    try:
        assert not watch.changed()
        mod = root / "corral" / "sub" / "mod.py"
        st = mod.stat()
        if change == "edit":
            mod.write_text("x = 2\n")
            os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        elif change == "add":
            (root / "corral" / "sub" / "new.py").write_text("")
        elif change == "remove":
            mod.unlink()
        else:
            # Times unchanged: only inotify notices (the stamp sees no difference).
            os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert watch.changed() is (inotify or change != "touch")
    finally:
        watch.close()


def test_the_tree_watch_ignores_bytecode_caches(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    watch = TreeWatch(str(root))
    try:
        (root / "corral" / "sub" / "__pycache__").mkdir()
        (root / "corral" / "sub" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"")
        assert not watch.changed()
        (root / "corral" / "sub" / "mod.py").write_text("x = 3\n")
        assert watch.changed()
    finally:
        watch.close()


def test_binds_over_socket_directories_are_refused(tmp_path: Path) -> None:
    env = {"CORRAL_LAUNCHER_SOCKET": str(tmp_path / "base" / "launcher" / "l.sock")}
    (tmp_path / "base" / "launcher").mkdir(parents=True)
    assert launcher_dir(env) == str(tmp_path / "base" / "launcher")
    (tmp_path / "other").mkdir()
    refuse_socket_dirs([str(tmp_path / "other")], env)
    for tree in (tmp_path, tmp_path / "base", tmp_path / "base" / "launcher"):
        with pytest.raises(UsageError, match="launcher and broker sockets"):
            refuse_socket_dirs([str(tree)], env)


def test_frontend_configuration_is_escaped_for_c() -> None:
    from corral.exec.frontend import _c_string, defines

    assert _c_string('/a b/"q"\\n\n') == '"/a b/\\042q\\042\\134n\\012"'
    assert _c_string("/é") == '"/\\303\\251"'
    assert any(d.startswith('-DCORRAL_BUILD_ID="corral-launcher-2 ') for d in defines())


def test_worker_environment_is_exactly_the_clients() -> None:
    """Names only the launcher had are gone, changed ones changed, in os.environ
    and in the C environment that exec'd programs inherit."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    saved = dict(os.environ)
    try:
        os.environ["CORRAL_TEST_ONLY_LAUNCHER"] = "1"
        os.environ["CORRAL_TEST_CHANGED"] = "old"
        client = {k: v for k, v in saved.items() if k != "HOME"}
        client |= {"CORRAL_TEST_CHANGED": "new", "CORRAL_TEST_ONLY_CLIENT": "x y"}
        launcher._set_environ(client)
        assert dict(os.environ) == client
        assert libc.getenv(b"CORRAL_TEST_ONLY_LAUNCHER") is None
        assert libc.getenv(b"HOME") is None
        assert libc.getenv(b"CORRAL_TEST_CHANGED") == b"new"
        assert libc.getenv(b"CORRAL_TEST_ONLY_CLIENT") == b"x y"
    finally:
        launcher._set_environ(saved)
    assert dict(os.environ) == saved


def test_the_rehearsal_request_is_what_the_front_end_sends() -> None:
    """The warm worker rehearses on a request the real path accepts: same build, this
    process's own umask, limits and environment."""
    import resource

    head, body = launcher._rehearsal_request()
    assert head == launcher.MAGIC + len(body).to_bytes(4, "big")
    req = parse_request(body, launcher.NFDS)
    assert req.build_id == launcher.BUILD_ID
    assert req.argv == ("exec", "--", "true")
    assert dict(req.env) == dict(os.environ)
    assert len(req.rlimits) == 16
    for res, soft, hard in req.rlimits:
        got = resource.getrlimit(res)
        assert (soft, hard) == tuple(-1 if v == resource.RLIM_INFINITY else v for v in got)


def _state() -> tuple[list[str], object, dict[str, str], int, list[tuple[int, int]]]:
    import resource
    import signal

    fds = sorted(os.listdir("/proc/self/fd"))
    mask = os.umask(0o022)
    os.umask(mask)
    limits = [resource.getrlimit(r) for r in range(16)]
    return fds, signal.getsignal(signal.SIGIO), dict(os.environ), mask, limits


def test_the_rehearsal_leaves_nothing_for_the_request() -> None:
    """What a warm worker runs before it waits must not reach the client's request:
    no descriptor, no SIGIO handler, no environment, umask or limit of its own."""
    before = _state()
    launcher._rehearse()
    assert _state() == before


def test_the_rehearsal_never_blocks_on_a_huge_environment() -> None:
    """A body beyond the socketpair's buffer would block the warm worker for good
    (nobody reads while it writes): it gives up instead, and leaves nothing."""
    import signal

    os.environ["CORRAL_TEST_HUGE"] = "x" * (1 << 20)
    old = signal.signal(signal.SIGALRM, signal.default_int_handler)
    try:
        before = _state()
        signal.alarm(20)
        launcher._rehearse()
        signal.alarm(0)
        assert _state() == before
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        del os.environ["CORRAL_TEST_HUGE"]
