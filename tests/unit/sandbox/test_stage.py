"""The pure half of the mounts staged before bwrap (`sandbox/stage.py`)."""

from __future__ import annotations

from corral.sandbox.bwrap import StagedBind
from corral.sandbox.stage import ETC_STAGE, describe, plan_etc, split_protect


def test_plan_etc_takes_the_files_under_etc_and_leaves_the_rest_to_bwrap() -> None:
    data = [
        ("/etc/passwd", b"p"),
        ("/etc/ssh/ssh_config", b"s"),
        ("/run/corral/init.py", b"i"),
    ]
    etc, rest = plan_etc(("ssl", "localtime"), (("localtime", "/usr/share/zoneinfo/UTC"),), data)
    assert etc.entries == ("ssl",)  # a symlink is recreated, never cloned
    assert etc.links == (("localtime", "/usr/share/zoneinfo/UTC"),)
    assert etc.files == (("passwd", b"p"), ("ssh/ssh_config", b"s"))
    assert rest == [("/run/corral/init.py", b"i")]


def test_etc_tmpfs_is_sized_for_its_files() -> None:
    etc, _ = plan_etc((), (), [("/etc/big", b"x" * 10_000), ("/etc/small", b"y")])
    opts = dict(o.split(b"=") for o in etc.size_option().split(b","))
    assert int(opts[b"size"]) >= 4 * 4096  # 3 pages + 1 page, each rounded up
    assert int(opts[b"size"]) < 64 * 1024


def test_split_protect_keeps_binds_outside_staged_trees_for_bwrap() -> None:
    binds = (
        StagedBind("/run/corral-stage/0/a/.git", "/w/a/.git", False),
        StagedBind("/run/corral-stage/0/a", "/w/a", True),
        StagedBind("/elsewhere/.git", "/elsewhere/.git", False),
    )
    selfs, rest = split_protect(binds, ("/run/corral-stage/0", "/run/corral-stage/1"))
    # Parents first: the pin is mounted before the guard inside it.
    assert selfs == (
        ("/run/corral-stage/0", "a", True, "/w/a"),
        ("/run/corral-stage/0", "a/.git", False, "/w/a/.git"),
    )
    assert rest == (StagedBind("/elsewhere/.git", "/elsewhere/.git", False),)


def test_split_protect_does_not_confuse_a_tree_with_its_prefix() -> None:
    selfs, rest = split_protect(
        (StagedBind("/run/corral-stage/10/.git", "/x/.git", False),), ("/run/corral-stage/1",)
    )
    assert selfs == () and len(rest) == 1


def test_describe_names_every_staged_mount_and_its_destination() -> None:
    etc, _ = plan_etc(("ssl",), (("os-release", "/usr/lib/os-release"),), [("/etc/hosts", b"h")])
    rows = describe(etc, (("/run/corral-stage/0", ".bashrc", False, "/w/.bashrc"),))
    assert rows == [
        ("ro-clone", "/etc/ssl", f"{ETC_STAGE}/ssl"),
        ("symlink", "/usr/lib/os-release", f"{ETC_STAGE}/os-release"),
        ("file", "(1 bytes)", f"{ETC_STAGE}/hosts"),
        ("ro-self-bind", "/run/corral-stage/0/.bashrc", "/w/.bashrc"),
    ]


def test_describe_shows_the_staged_dev() -> None:
    rows = describe(None, (), dev=True)
    assert ("dev-clone", "/dev/null", "/run/corral-stage/dev/null") in rows
    assert ("symlink", "pts/ptmx", "/run/corral-stage/dev/ptmx") in rows
    assert [r[0] for r in rows].count("devpts") == 1


def test_describe_names_the_network_namespace_made_before_bwrap() -> None:
    assert describe(None, (), net=True)[0] == ("netns", "new", "lo")
    assert all(r[0] != "netns" for r in describe(None, ()))


def test_user_binds_under_etc_outside_the_entries_get_mountpoints() -> None:
    etc, _ = plan_etc(
        ("ssl",),
        (),
        [],
        (("/etc/ssh", True), ("/etc/ssl/certs", True), ("/etc/x/y.conf", False), ("/d", True)),
    )
    # Inside a cloned entry the host path (and so the clone) already has it.
    assert etc.mountpoints == (("ssh", True), ("x/y.conf", False))
