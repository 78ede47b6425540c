"""The gVisor backend's pure pieces: config.json, runsc argv, platform choice, exit decision."""

from __future__ import annotations

import dataclasses
import json
import signal

from corral.sandbox.bwrap import StagedBind
from corral.sandbox.gvisor import bundle as bd
from corral.sandbox.gvisor.backend import RUNSC_TASKS, TASKS_PER_PROCESS, cgroup_limits, decide_exit
from corral.sandbox.spec import Bind, Limits, SandboxSpec

SPEC = SandboxSpec(
    argv=("git", "status"),
    workspace="/home/u/ws",
    env=(("PATH", "/usr/bin:/bin"), ("HOME", "/home/corral")),
    binds=(Bind("/opt/data", False),),
    limits=Limits(memory_bytes=1 << 30, pids=100),
)
PLAN = bd.BundlePlan(
    spec=SPEC,
    system_links=(("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", None)),
    etc_entries=("ssl", "nsswitch.conf"),
    binds=(
        StagedBind("/run/corral-stage/0", "/home/u/ws", True),
        StagedBind("/run/corral-stage/1", "/opt/data", False),
    ),
    files_dir="/run/corral-gvisor/x/bundle/files",
    protect_binds=(StagedBind("/run/corral-stage/0/.git/hooks", "/home/u/ws/.git/hooks", False),),
)


def _b(src: str, dst: str, rw: bool) -> dict[str, object]:
    return {
        "destination": dst,
        "type": "bind",
        "source": src,
        "options": ["rbind", "rw" if rw else "ro", "nosuid", "nodev"],
    }


def _t(dst: str, mode: str = "mode=755") -> dict[str, object]:
    return {
        "destination": dst,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", mode],
    }


_NO_CAPS: dict[str, list[str]] = {
    k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
}
#: The command, `runsc exec`ed beside the holder: the caller's uid, no
#: capabilities, exactly the spec's env (rlimits: the container's).
COMMAND: dict[str, object] = {
    "terminal": False,
    "user": {"uid": 1000, "gid": 1000, "additionalGids": []},
    "args": ["git", "status"],
    "env": ["PATH=/usr/bin:/bin", "HOME=/home/corral"],
    "cwd": "/home/u/ws",
    "capabilities": _NO_CAPS,
    "noNewPrivileges": True,
}
GOLDEN: dict[str, object] = {
    "ociVersion": "1.0.0",
    "process": {
        "terminal": False,
        "user": {"uid": 0, "gid": 0, "additionalGids": []},
        "args": list(bd.holder(1000)),
        "env": ["PATH=/usr/bin:/bin"],
        "cwd": "/",
        "capabilities": _NO_CAPS,
        "noNewPrivileges": True,
        "rlimits": [{"type": "RLIMIT_NPROC", "hard": 100, "soft": 100}],
    },
    "root": {"path": "rootfs", "readonly": True},
    "hostname": "corral",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        _b("/usr", "/usr", False),
        _b("/lib64", "/lib64", False),
        _t("/tmp", "mode=1777"),
        _t("/home"),
        _t("/var"),
        _t("/var/tmp", "mode=1777"),
        _t("/run"),
        {
            "destination": "/home/corral",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=755", "uid=1000", "gid=1000"],
        },
        _b("/etc/ssl", "/etc/ssl", False),
        _b("/etc/nsswitch.conf", "/etc/nsswitch.conf", False),
        _b("/run/corral-gvisor/x/bundle/files/passwd", "/etc/passwd", False),
        _b("/run/corral-gvisor/x/bundle/files/group", "/etc/group", False),
        _b("/run/corral-gvisor/x/bundle/files/hosts", "/etc/hosts", False),
        _b("/run/corral-stage/1", "/opt/data", False),
        _b("/run/corral-stage/0", "/home/u/ws", True),
        _b("/run/corral-stage/0/.git/hooks", "/home/u/ws/.git/hooks", False),
    ],
    "linux": {
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")],
        "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
        "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"],
    },
}


def test_config_is_golden() -> None:
    assert bd.build_config(PLAN) == GOLDEN


def test_config_is_fresh_each_call() -> None:
    first = bd.build_config(PLAN)
    first["mounts"].append({"destination": "/evil"})  # type: ignore[attr-defined]
    assert bd.build_config(PLAN) == GOLDEN
    json.dumps(GOLDEN)  # serialisable as written


def test_env_is_exactly_the_spec() -> None:
    proc = bd.command_process(PLAN)
    assert proc == COMMAND
    assert proc["env"] == ["PATH=/usr/bin:/bin", "HOME=/home/corral"]
    assert bd.command_process(PLAN) is not proc


def test_holder_is_not_the_commands_uid() -> None:
    """The command cannot signal a process of another uid without CAP_KILL."""
    holder = bd.build_config(PLAN)["process"]
    assert isinstance(holder, dict)
    assert holder["user"] != COMMAND["user"]
    assert holder["capabilities"] == _NO_CAPS


def test_leftover_answer_is_one_bounded_decimal_line() -> None:
    assert bd.parse_left(b"left 2\n") == 2
    assert bd.parse_left(b"left 0\n") == 0
    for bad in (b"", b"left 2", b"left -1\n", b"left 2\nleft 0\n", b"left 1234567890\n"):
        assert bd.parse_left(bad) is None
    assert len(b"left 999999999\n") <= bd.MAX_LEFT


def test_no_host_path_but_the_allowed_ones() -> None:
    mounts = bd.build_config(PLAN)["mounts"]
    assert isinstance(mounts, list)
    sources = {m["source"] for m in mounts if m["type"] == "bind"}
    assert not sources & {"/", "/root", "/etc", "/home", "/run", "/var", "/tmp", "/dev"}


def test_mount_points() -> None:
    pts = dict(bd.mount_points(PLAN))
    assert pts["bin"] == "usr/bin" and pts["lib"] == "usr/lib"
    for d in ("proc", "dev", "usr", "etc", "tmp", "home", "var", "run", "opt", "lib64"):
        assert pts[d] is None


def test_runsc_argv() -> None:
    argv = bd.runsc_argv(
        runsc="/usr/bin/runsc", platform="ptrace", state_dir="/s", bundle_dir="/b", container_id="c"
    )
    assert argv == [
        "/usr/bin/runsc",
        "--root",
        "/s",
        "--platform=ptrace",
        "--network=none",
        "--ignore-cgroups",
        "run",
        "--bundle",
        "/b",
        "c",
    ]


def test_netns_path_and_proxy_rewrite() -> None:
    from dataclasses import replace

    from corral.sandbox.gvisor.net import BROKER_IP, rewrite_proxy_env

    cfg = bd.build_config(replace(PLAN, netns_path="/proc/self/ns/net"))
    linux = cfg["linux"]
    assert isinstance(linux, dict)
    assert {"type": "network", "path": "/proc/self/ns/net"} in linux["namespaces"]
    env = rewrite_proxy_env((("HTTP_PROXY", "http://127.0.0.1:3128"), ("A", "127.0.0.1:80")), 3128)
    assert env == (("HTTP_PROXY", f"http://{BROKER_IP}:3128"), ("A", "127.0.0.1:80"))


def test_platform_choice() -> None:
    assert bd.choose_platform(None, version_date=20221219, hardware_virt=False) == (
        "ptrace",
        "best available",
    )
    assert bd.choose_platform(None, version_date=20221219, hardware_virt=True)[0] == "kvm"
    assert bd.choose_platform(None, version_date=20240101, hardware_virt=False)[0] == "systrap"
    # A paravirtual /dev/kvm (no vmx/svm) must never select kvm, even on request.
    assert bd.choose_platform("kvm", version_date=20221219, hardware_virt=False)[0] is None
    assert bd.choose_platform("bogus", version_date=20240101, hardware_virt=True)[0] is None


def test_exit_decision() -> None:
    assert decide_exit(rc=3, oom_kills=0, timed_out=False, interrupted=0) == (3, "exited")
    assert decide_exit(rc=0, oom_kills=0, timed_out=True, interrupted=0) == (124, "timeout")
    assert decide_exit(rc=137, oom_kills=1, timed_out=False, interrupted=0) == (137, "oom")
    assert decide_exit(rc=-9, oom_kills=1, timed_out=False, interrupted=0) == (137, "oom")
    # runsc exec lost the sentry the OOM killer picked.
    assert decide_exit(rc=128, oom_kills=1, timed_out=False, interrupted=0) == (137, "oom")
    assert decide_exit(rc=128, oom_kills=0, timed_out=False, interrupted=0) == (128, "exited")
    assert decide_exit(rc=-9, oom_kills=0, timed_out=False, interrupted=0) == (137, "killed")
    assert decide_exit(rc=0, oom_kills=0, timed_out=False, interrupted=signal.SIGTERM) == (
        143,
        "killed",
    )
    assert decide_exit(rc=None, oom_kills=0, timed_out=False, interrupted=0) == (125, "refused")


def test_cgroup_limits_add_gvisor_tasks() -> None:
    assert cgroup_limits(Limits(pids=10)).pids == RUNSC_TASKS + 10 * TASKS_PER_PROCESS
    assert cgroup_limits(Limits()).pids is None
    assert cgroup_limits(Limits(memory_bytes=5)).memory_bytes == 5


def test_prepared_etc_is_one_mount() -> None:
    from dataclasses import replace

    cfg = bd.build_config(replace(PLAN, etc_dir="/run/corral-gvisor/x/bundle/etc"))
    etc = [m for m in cfg["mounts"] if str(m["destination"]).startswith("/etc")]  # type: ignore[attr-defined]
    assert etc == [_b("/run/corral-gvisor/x/bundle/etc", "/etc", False)]


def test_supervised_process_is_the_static_supervisor() -> None:
    """Without a network hook pid 1 is corral's static supervisor (no shell): uid 0
    with the three capabilities it needs, the spec's env and cwd untouched, the
    command's argv after "--" as data."""
    plan = dataclasses.replace(PLAN, report_dir="/run/corral-gvisor/x/report")
    config = bd.build_config(plan)
    proc = config["process"]
    assert isinstance(proc, dict)
    assert proc["args"] == [
        "/run/corral-report/gvsup",
        "/run/corral-report/status",
        "1000",
        "1000",
        "--",
        "git",
        "status",
    ]
    assert proc["env"] == COMMAND["env"]
    assert proc["cwd"] == COMMAND["cwd"]
    assert proc["user"] == {"uid": 0, "gid": 0, "additionalGids": []}
    caps = proc["capabilities"]
    assert isinstance(caps, dict)
    assert caps["bounding"] == ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]
    assert caps["inheritable"] == caps["ambient"] == []
    assert _b("/run/corral-gvisor/x/report", "/run/corral-report", True) in config["mounts"]  # type: ignore[operator]
