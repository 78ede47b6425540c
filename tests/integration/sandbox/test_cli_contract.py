"""The `corral exec` contract: exit codes, bad input, the workspace, degraded layers (M10)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import ExecFn, corral_argv, parse_summary

pytestmark = [pytest.mark.requires_sandbox]

SUMMARY_KEYS = {
    "exit",
    "reason",
    "wall_s",
    "cpu_s",
    "peak_memory_bytes",
    "processes_killed_at_end",
    "observations",
    "layers",
}


def test_exit_status_is_the_commands_own(corral_exec: ExecFn) -> None:
    out = corral_exec("sh", "-c", "exit 7")
    assert out.code == 7
    assert out.summary["reason"] == "exited"
    assert set(out.summary) >= SUMMARY_KEYS
    assert out.summary["observations"] == {"allowed": 0, "denied": 0}


def test_killed_by_signal(corral_exec: ExecFn) -> None:
    out = corral_exec("sh", "-c", "kill -9 $$")
    assert out.code == 137
    assert out.summary["reason"] == "killed"


def test_layers_reported(corral_exec: ExecFn) -> None:
    out = corral_exec("true")
    layers = out.summary["layers"]
    assert isinstance(layers, dict)
    for name in ("bwrap", "userns", "pidns", "netns", "cgroup", "seccomp", "landlock", "idmap"):
        assert layers.get(name) not in (None, False) and not str(layers[name]).startswith(
            "degraded"
        ), name


def test_private_workspace_and_file_ownership(corral_exec: ExecFn, workspace: Path) -> None:
    assert workspace.stat().st_mode & 0o777 == 0o700
    (workspace / "input.txt").write_text("from host\n")
    (workspace / "input.txt").chmod(0o600)
    out = corral_exec(
        "sh", "-c", "cat input.txt && mkdir -p sub && echo made > sub/new.txt && ls -ln"
    )
    assert out.code == 0, out.stderr
    assert "from host" in out.stdout
    for p in (workspace / "sub", workspace / "sub" / "new.txt"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid()), p


def test_ro_and_rw_paths(corral_exec: ExecFn, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    rw = tmp_path / "rw"
    ro.mkdir(mode=0o700)
    rw.mkdir(mode=0o700)
    (ro / "data").write_text("readable\n")
    out = corral_exec(
        "sh",
        "-c",
        f"cat {ro}/data; echo no > {ro}/x; echo yes > {rw}/y",
        opts=("--ro", str(ro), "--rw", str(rw)),
    )
    assert "readable" in out.stdout
    assert not (ro / "x").exists()
    assert (rw / "y").read_text() == "yes\n"
    assert (rw / "y").stat().st_uid == os.getuid()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        corral_argv(*args), capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--bogus-flag", "--", "true"), "unrecognized"),
        (("--memory", "lots", "--", "true"), "invalid size"),
        (("--timeout", "soon", "--", "true"), "invalid duration"),
        (("--cpus", "many", "--", "true"), "invalid CPU"),
        (("--pids", "0", "--", "true"), "pids"),
        (("--workspace", "/nonexistent/corral-ws", "--", "true"), "does not exist"),
        (("--workspace", "/etc/hostname", "--", "true"), "not a directory"),
        (("--ro", "/nonexistent/corral-ro", "--", "true"), "does not exist"),
        (("--workspace", "/", "--", "true"), "cannot be /"),
        (("--workspace", "/usr", "--", "true"), "system directory"),
        (("--",), "no command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: tuple[str, ...], needle: str, workspace: Path
) -> None:
    full = args if "--workspace" in args else ("--workspace", str(workspace), *args)
    proc = _cli(*full)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]


def test_command_not_found_is_127(corral_exec: ExecFn) -> None:
    out = corral_exec("no-such-command-corral")
    assert out.code == 127
    assert "command not found" in out.stderr


def test_home_as_workspace_refused() -> None:
    proc = _cli("--workspace", os.path.expanduser("~"), "--", "true")
    assert proc.returncode == 2
    assert "home directory" in proc.stderr


def _with_readonly_cgroups(argv: list[str]) -> list[str]:
    """Run argv in a private mount namespace where every cgroup mount is read-only."""
    script = (
        "for m in $(awk '$3 ~ /^cgroup2?$/ {print $2}' /proc/mounts); do "
        'mount -o remount,bind,ro "$m" || exit 99; done; exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


def test_refuses_when_cgroups_are_not_writable(workspace: Path) -> None:
    """M10: with no writable cgroup hierarchy exec refuses with 125, unless degraded explicitly."""
    cmd = corral_argv("--workspace", str(workspace), "--json", "--", "sh", "-c", "echo ran")
    proc = subprocess.run(
        _with_readonly_cgroups(cmd), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 125, proc.stderr
    assert "ran" not in proc.stdout
    first = proc.stderr.splitlines()[0]
    assert "cgroup" in first and "--allow-degraded cgroup" in first
    assert parse_summary(proc.stderr)["reason"] == "refused"

    cmd = corral_argv(
        "--workspace",
        str(workspace),
        "--json",
        "--allow-degraded",
        "cgroup",
        "--",
        "sh",
        "-c",
        "echo ran",
    )
    degraded = subprocess.run(
        _with_readonly_cgroups(cmd), capture_output=True, text=True, timeout=60, check=False
    )
    assert degraded.returncode == 0, degraded.stderr
    assert "ran" in degraded.stdout
    layers = parse_summary(degraded.stderr)["layers"]
    assert isinstance(layers, dict)
    assert str(layers["cgroup"]).startswith("degraded")


def test_dry_run_prints_bwrap_line(workspace: Path) -> None:
    proc = _cli("--workspace", str(workspace), "--dry-run", "--", "echo", "hi")
    assert proc.returncode == 0
    assert proc.stdout.startswith(("/usr/bin/bwrap", "bwrap"))
    # As root corral's child makes the network namespace before bwrap (and says so).
    own_net = "--unshare-net" in proc.stdout or "# staged: netns new lo" in proc.stdout
    assert own_net and "--die-with-parent" in proc.stdout


def test_json_summary_is_valid_json(corral_exec: ExecFn) -> None:
    out = corral_exec("true")
    assert json.loads(json.dumps(out.summary)) == out.summary
    assert out.summary["exit"] == 0
