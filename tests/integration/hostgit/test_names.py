"""Workspace names are bytes end to end: corral's git commits and snapshots any name.

A sandbox chooses its file names: bytes that are not UTF-8, newlines, a
leading `-`, rich markup, and names that git itself would *unquote* — a
line of `hash-object --stdin-paths` that starts with `"` is read as a
C-quoted path, so a file named `"..\\057secret"` made corral hash a host
file outside the workspace into the commit (and into the product's snapshot).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from corral.hostgit import TrustedRepo

NAMES: tuple[bytes, ...] = (
    b"bad\xff.txt",
    b"new\nline",
    b"cr\rname",
    b"-rf",
    b"--output=x",
    b"[red]x[link=file:]y",
    b"tab\tname",
    b'quote"inside',
    b"back\\slash",
    b"\xe2\x80\xaeexe.txt",  # U+202E, valid UTF-8
    b"\x1b]8;;x\x07",
)


def _ls_tree(repo: TrustedRepo, commit: str) -> dict[bytes, bytes]:
    out = repo.git("ls-tree", "-r", "-z", commit)
    entries: dict[bytes, bytes] = {}
    for rec in out.split(b"\0"):
        if rec:
            meta, path = rec.split(b"\t", 1)
            entries[path] = meta.split()[2]
    return entries


def test_hostile_names_commit_and_snapshot(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    root = os.fsencode(ws)
    for name in NAMES:
        with open(os.path.join(root, name), "wb") as fh:
            fh.write(b"content of " + name)
    os.mkdir(os.path.join(root, b"dir\xfa"))
    with open(os.path.join(root, b"dir\xfa", b"inner\xfb"), "wb") as fh:
        fh.write(b"inner")
    os.symlink(b"bad\xff.txt", os.path.join(root, b"link\xfc"))
    repo = TrustedRepo(tmp_path / "git", ws)
    repo.init()
    commit = repo.commit_all("session 1: agent failed: \x00 [red]\ud800")
    tree = _ls_tree(repo, commit)
    expected = {*NAMES, b"dir\xfa/inner\xfb", b"link\xfc"}
    assert set(tree) == expected
    for name in NAMES:
        blob = repo.git("cat-file", "blob", tree[name].decode())
        assert blob == b"content of " + name
    skipped = repo.snapshot(commit, tmp_path / "snap")
    assert skipped == []
    snap = os.fsencode(tmp_path / "snap")
    assert set(os.listdir(snap)) == {*NAMES, b"dir\xfa", b"link\xfc"}
    for name in NAMES:
        with open(os.path.join(snap, name), "rb") as fh:
            assert fh.read() == b"content of " + name
    assert os.readlink(os.path.join(snap, b"link\xfc")) == b"bad\xff.txt"
    assert repo.log(1)[0].endswith("session 1: agent failed: \\0 [red]\\ud800")
    # A second commit of the same tree works too (resume re-commits the workspace).
    repo.commit_all("again")


@pytest.mark.parametrize(
    "planted",
    [b'"..\\057secret"', b'"..\\057..\\057host\\057secret"'],
)
def test_c_quoted_name_does_not_read_a_host_file(tmp_path: Path, planted: bytes) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_bytes(b"HOST SECRET\n")
    (tmp_path / "secret").write_bytes(b"HOST SECRET\n")
    ws = host / "ws"
    ws.mkdir()
    with open(os.path.join(os.fsencode(ws), planted), "wb") as fh:
        fh.write(b"sandbox bytes")
    repo = TrustedRepo(tmp_path / "git", ws)
    repo.init()
    commit = repo.commit_all("s1")
    tree = _ls_tree(repo, commit)
    assert list(tree) == [planted]
    blob = repo.git("cat-file", "blob", tree[planted].decode())
    assert blob == b"sandbox bytes", "corral hashed a host file named by the sandbox"
    all_blobs = subprocess.run(
        ["git", "--git-dir", str(tmp_path / "git"), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
        check=True,
    ).stdout
    assert b"HOST SECRET" not in all_blobs
