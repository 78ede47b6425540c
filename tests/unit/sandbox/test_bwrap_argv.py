"""Golden tests of the bubblewrap argv builder (pure)."""

from __future__ import annotations

from corral.sandbox.bwrap import BwrapPlan, StagedBind, build_argv
from corral.sandbox.spec import Bind, SandboxSpec


def _plan(**over: object) -> BwrapPlan:
    spec = SandboxSpec(
        argv=("echo", "hi"),
        workspace="/work/p",
        env=(("PATH", "/usr/bin"),),
        binds=(Bind("/data", writable=False),),
    )
    base: dict[str, object] = {
        "bwrap": "/usr/bin/bwrap",
        "spec": spec,
        "system_links": (("bin", "usr/bin"), ("lib", "usr/lib")),
        "etc_entries": ("ld.so.cache", "ssl"),
        "binds": (
            StagedBind("/run/corral-stage/1", "/data", False),
            StagedBind("/run/corral-stage/0", "/work/p", True),
        ),
        "data_files": (("/etc/passwd", 10),),
        "init_argv": (
            "/usr/bin/python3",
            "-I",
            "-S",
            "/run/corral/init.py",
            "{}",
            "--",
            "echo",
            "hi",
        ),
        "seccomp_fd": 12,
    }
    base.update(over)
    return BwrapPlan(**base)  # type: ignore[arg-type]


GOLDEN = [
    "/usr/bin/bwrap",
    "--unshare-user",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--new-session",
    "--uid",
    "1000",
    "--gid",
    "1000",
    "--hostname",
    "corral",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--tmpfs",
    "/home",
    "--tmpfs",
    "/var",
    "--dir",
    "/var/tmp",
    "--tmpfs",
    "/run",
    "--dir",
    "/run/corral",
    "--dir",
    "/home/corral",
    "--ro-bind",
    "/etc/ld.so.cache",
    "/etc/ld.so.cache",
    "--ro-bind",
    "/etc/ssl",
    "/etc/ssl",
    "--ro-bind-data",
    "10",
    "/etc/passwd",
    "--ro-bind",
    "/run/corral-stage/1",
    "/data",
    "--bind",
    "/run/corral-stage/0",
    "/work/p",
    "--remount-ro",
    "/",
    "--seccomp",
    "12",
    "--chdir",
    "/work/p",
    "--",
    "/usr/bin/python3",
    "-I",
    "-S",
    "/run/corral/init.py",
    "{}",
    "--",
    "echo",
    "hi",
]


def test_golden_argv() -> None:
    assert build_argv(_plan()) == GOLDEN


def test_build_twice_is_identical_and_fresh() -> None:
    plan = _plan()
    a = build_argv(plan)
    b = build_argv(plan)
    assert a == b
    assert a is not b


def test_user_binds_mount_parents_first() -> None:
    plan = _plan(binds=(StagedBind("/s/1", "/a/b/c", True), StagedBind("/s/0", "/a", True)))
    argv = build_argv(plan)
    assert argv.index("/a") < argv.index("/a/b/c")


def test_tmpfs_dirs_before_user_binds() -> None:
    plan = _plan(binds=(StagedBind("/s/0", "/tmp/ws", True),))
    argv = build_argv(plan)
    assert argv.index("/tmp") < argv.index("/tmp/ws")


def test_optional_fds() -> None:
    argv = build_argv(_plan(seccomp_fd=None, info_fd=7, block_fd=8))
    assert "--seccomp" not in argv
    assert argv[argv.index("--info-fd") + 1] == "7"
    assert argv[argv.index("--block-fd") + 1] == "8"


def test_a_network_namespace_made_before_bwrap_is_kept() -> None:
    """`unshare_net=False`: the root child is already in the sandbox's own
    namespace (`mounts.make_net_ns`); every other namespace is still bwrap's."""
    kept = build_argv(_plan(unshare_net=False))
    assert "--unshare-net" not in kept and "--share-net" not in kept
    assert {"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"} <= set(kept)
    assert "--unshare-net" in build_argv(_plan())


def test_real_directories_are_bound_not_linked() -> None:
    argv = build_argv(_plan(system_links=(("lib64", None),)))
    i = argv.index("/lib64")
    assert argv[i - 1 : i + 2] == ["--ro-bind", "/lib64", "/lib64"]


def test_no_host_root_or_secrets_mounted() -> None:
    argv = build_argv(_plan())
    sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert "/" not in sources
    assert not any(
        s.startswith(("/root", "/home", "/etc/shadow", "/var/run", "/run/user")) for s in sources
    )


def test_ro_binds_follow_data_files_before_user_binds() -> None:
    argv = build_argv(_plan(ro_binds=(("/var/cache/corral/corral-init-x", "/run/corral/init"),)))
    i = argv.index("/run/corral/init")
    assert argv[i - 2 : i + 1] == [
        "--ro-bind",
        "/var/cache/corral/corral-init-x",
        "/run/corral/init",
    ]
    assert argv.index("/etc/passwd") < i < argv.index("/work/p")


def test_json_status_fd_before_the_command() -> None:
    argv = build_argv(_plan(json_status_fd=13))
    i = argv.index("--json-status-fd")
    assert argv[i + 1] == "13"
    assert i < argv.index("--chdir")


def test_protect_binds_come_after_every_user_bind() -> None:
    # A protected path inside the workspace must be mounted over the
    # workspace bind, never hidden under it.
    protect = (
        StagedBind("/run/corral-stage/0/.git", "/work/p/.git", False),
        StagedBind("/run/corral-stage/0/a", "/work/p/a", True),
        StagedBind("/run/corral-stage/0/a/.git", "/work/p/a/.git", False),
    )
    argv = build_argv(_plan(protect_binds=protect))
    i = argv.index("/work/p/.git")
    assert argv[i - 2 : i + 7] == [
        "--ro-bind",
        "/run/corral-stage/0/.git",
        "/work/p/.git",
        "--bind",
        "/run/corral-stage/0/a",
        "/work/p/a",
        "--ro-bind",
        "/run/corral-stage/0/a/.git",
        "/work/p/a/.git",
    ]
    assert argv.index("/work/p") < i < argv.index("--remount-ro")
    assert build_argv(_plan()) == GOLDEN


def test_a_pinned_directory_never_covers_a_deeper_user_bind() -> None:
    plan = _plan(
        binds=(
            StagedBind("/run/corral-stage/0", "/work/p", True),
            StagedBind("/run/corral-stage/1", "/work/p/a/data", False),
        ),
        protect_binds=(
            StagedBind("/run/corral-stage/0/a", "/work/p/a", True),
            StagedBind("/run/corral-stage/0/a/b/.git", "/work/p/a/b/.git", False),
        ),
    )
    argv = build_argv(plan)
    assert argv.index("/work/p") < argv.index("/work/p/a") < argv.index("/work/p/a/data")


def test_etc_links_are_symlinks_after_the_etc_binds() -> None:
    argv = build_argv(_plan(etc_links=(("localtime", "/usr/share/zoneinfo/Etc/UTC"),)))
    i = argv.index("/etc/localtime")
    assert argv[i - 2 : i + 1] == ["--symlink", "/usr/share/zoneinfo/Etc/UTC", "/etc/localtime"]
    assert argv.index("/etc/ssl") < i < argv.index("/etc/passwd")


def test_etc_link_target_only_into_usr() -> None:
    from corral.sandbox.bwrap import etc_link_target

    assert etc_link_target("/usr/share/zoneinfo/Etc/UTC") == "/usr/share/zoneinfo/Etc/UTC"
    assert etc_link_target("../usr/lib/os-release") == "/usr/lib/os-release"
    # Targets the sandbox does not see as the host does stay binds (followed by bwrap).
    assert etc_link_target("/var/lib/tz/localtime") is None
    assert etc_link_target("../proc/self/mounts") is None
    assert etc_link_target("/usr/../etc/shadow") is None
    assert etc_link_target("zoneinfo") is None


def test_staged_etc_is_one_read_only_bind_in_place_of_the_entries() -> None:
    # As root /etc is staged before bwrap (sandbox/stage.py): one bind, not one per entry.
    argv = build_argv(
        _plan(etc_stage="/run/corral-stage/etc", etc_entries=(), data_files=(), etc_links=())
    )
    i = argv.index("/run/corral-stage/etc")
    assert argv[i - 1 : i + 2] == ["--ro-bind", "/run/corral-stage/etc", "/etc"]
    assert [a for a in argv if a.startswith("/etc")] == ["/etc"]
    assert argv.index("/home/corral") < i < argv.index("/work/p")


def test_staged_dev_is_one_device_bind_in_place_of_dev() -> None:
    argv = build_argv(_plan(dev_stage="/run/corral-stage/dev"))
    i = argv.index("--dev-bind")
    assert argv[i - 2 : i + 3] == ["--proc", "/proc", "--dev-bind", "/run/corral-stage/dev", "/dev"]
    assert "--dev" not in argv
