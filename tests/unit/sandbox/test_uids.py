"""The host uid allocator: range parsing and validation, flock leases, reclaim."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from corral.errors import SandboxStartError
from corral.sandbox import uids
from corral.sandbox.uids import UidRange


def test_parse_accepts_a_range_and_a_single_id() -> None:
    assert UidRange.parse("64000-64999") == UidRange(64000, 64999)
    assert UidRange.parse(" 70000 ") == UidRange(70000, 70000)
    assert UidRange.parse("64000-64999").size == 1000


@pytest.mark.parametrize(
    "text",
    ["", "abc", "64999-64000", "0-10", "999-2000", "65000-65600", "1000-9999999", "5-x"],
)
def test_parse_refuses_bad_ranges(text: str) -> None:
    with pytest.raises(SandboxStartError):
        UidRange.parse(text)


def _etc(tmp_path: Path, **files: str) -> str:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return str(tmp_path)


def test_range_conflicts_with_host_accounts_and_subordinate_ids(tmp_path: Path) -> None:
    r = UidRange(64000, 64999)
    clean = _etc(tmp_path, passwd="root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    assert uids.range_conflict(r, clean) is None
    (tmp_path / "passwd").write_text("svc:x:64100:100::/:/bin/false\n")
    assert "host user 'svc' (64100)" in (uids.range_conflict(r, clean) or "")
    (tmp_path / "passwd").write_text("")
    (tmp_path / "group").write_text("g:x:64999:\n")
    assert "host group 'g'" in (uids.range_conflict(r, clean) or "")
    (tmp_path / "group").write_text("")
    (tmp_path / "subuid").write_text("alice:63000:1001\n")
    assert "alice" in (uids.range_conflict(r, clean) or "")
    with pytest.raises(SandboxStartError, match="choose another range"):
        uids.configured_range({"CORRAL_UID_RANGE": "64000-64999"}, clean)
    (tmp_path / "subuid").write_text("alice:100000:65536\n")
    assert uids.configured_range({}, clean) == UidRange(64000, 64999)


def test_a_remembered_range_check_is_used_only_while_the_files_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = UidRange(64000, 64999)
    etc = _etc(tmp_path, passwd="root:x:0:0::/root:/bin/sh\n")
    (tmp_path / "subuid").write_text("alice:100000:65536\n")
    monkeypatch.setattr(uids, "_SETTLED_NS", 50_000_000)
    time.sleep(0.1)  # the files are settled: their ctime is older than the margin
    assert uids.range_conflict(r, etc) is None

    def unread(_r: UidRange, _etc: str) -> str | None:
        raise AssertionError("read again although nothing changed")

    real = uids._range_conflict
    monkeypatch.setattr(uids, "_range_conflict", unread)
    assert uids.range_conflict(r, etc) is None  # remembered: nothing is read
    # The same size, the same inode, in place: only the timestamps tell.
    (tmp_path / "subuid").write_text("alice:063000:01001\n")
    monkeypatch.setattr(uids, "_range_conflict", real)
    assert "alice" in (uids.range_conflict(r, etc) or "")
    (tmp_path / "subuid").unlink()
    assert uids.range_conflict(r, etc) is None
    with pytest.raises(SandboxStartError):
        uids.configured_range({}, _etc(tmp_path, passwd="svc:x:64100:100::/:/bin/false\n"))


def test_a_range_check_of_files_changed_just_before_is_not_remembered(tmp_path: Path) -> None:
    r = UidRange(64000, 64999)
    etc = _etc(tmp_path, passwd="root:x:0:0::/root:/bin/sh\n")
    assert uids.range_conflict(r, etc) is None
    # Within _SETTLED_NS of their change: a change in the same clock tick as
    # the read would leave every identity as it was.
    assert (r.first, r.last, etc) not in uids._answers


def test_busy_ids_reads_every_uid_and_gid_and_skips_zombies(tmp_path: Path) -> None:
    def proc(pid: int, state: str, uid: str, gid: str, threads: int = 1) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "status").write_text(
            f"Name:\tx\nState:\t{state}\nUid:\t{uid}\nGid:\t{gid}\nThreads:\t{threads}\n"
        )

    proc(10, "S (sleeping)", "0\t64001\t0\t0", "0\t0\t0\t0")
    proc(11, "R (running)", "0\t0\t0\t0", "0\t0\t0\t64002")
    proc(12, "Z (zombie)", "64003\t64003\t64003\t64003", "64003\t64003\t64003\t64003")
    proc(13, "Z (zombie)", "64004\t64004\t64004\t64004", "0\t0\t0\t0", threads=3)
    (tmp_path / "self").mkdir()
    assert uids.busy_ids(UidRange(64000, 64010), str(tmp_path)) == {64001, 64002, 64004}


def test_allocate_hands_out_distinct_ids_and_takes_them_back(tmp_path: Path) -> None:
    r = UidRange(64000, 64001)
    a = uids.allocate(r, str(tmp_path), busy=lambda _: set())
    b = uids.allocate(r, str(tmp_path), busy=lambda _: set())
    assert (a.uid, b.uid) == (64000, 64001) and a.gid == a.uid
    with pytest.raises(SandboxStartError, match="no free sandbox uid in 64000-64001"):
        uids.allocate(r, str(tmp_path), busy=lambda _: set())
    a.close()
    a.close()
    c = uids.allocate(r, str(tmp_path), busy=lambda _: set())
    assert c.uid == 64000
    b.close()
    c.close()


def test_allocate_skips_an_id_whose_processes_live_on(tmp_path: Path) -> None:
    lease = uids.allocate(UidRange(64000, 64002), str(tmp_path), busy=lambda _: {64000, 64001})
    assert lease.uid == 64002
    lease.close()


def test_a_killed_holder_gives_its_id_back(tmp_path: Path) -> None:
    r = UidRange(64000, 64000)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            uids.allocate(r, str(tmp_path), busy=lambda _: set())
            os.write(ready_w, b"1")
            signal.pause()
        finally:
            os._exit(1)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    with pytest.raises(SandboxStartError):
        uids.allocate(r, str(tmp_path), busy=lambda _: set())
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    lease = uids.allocate(r, str(tmp_path), busy=lambda _: set())
    assert lease.uid == 64000
    lease.close()


def test_only_a_clean_release_skips_the_process_scan(tmp_path: Path) -> None:
    r = UidRange(64000, 64000)
    scans: list[int] = []

    def busy(_: UidRange) -> set[int]:
        scans.append(1)
        return set()

    uids.allocate(r, str(tmp_path), busy=busy).close(clean=True)  # fresh file: scanned
    assert len(scans) == 1
    assert (tmp_path / "64000.lock").read_bytes() == b"closed\n"
    lease = uids.allocate(r, str(tmp_path), busy=busy)  # after a clean release: not scanned
    assert len(scans) == 1
    assert (tmp_path / "64000.lock").read_bytes() == b"in-use\n"
    lease.close()  # teardown did not prove the sandbox empty
    uids.allocate(r, str(tmp_path), busy=busy).close()
    assert len(scans) == 2
