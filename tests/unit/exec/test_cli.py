from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import UsageError
from corral.exec.cli import build_spec, parse_args, sandbox_env, validate_path


def test_parse_args_with_separator() -> None:
    ns, cmd = parse_args(["--memory", "1G", "--allow", "pypi.org", "--", "pip", "--version"])
    assert ns.memory == "1G"
    assert ns.allow == ["pypi.org"]
    assert cmd == ["pip", "--version"]


def test_parse_args_without_separator() -> None:
    ns, cmd = parse_args(["--pids", "10", "echo", "hi"])
    assert ns.pids == "10"
    assert cmd == ["echo", "hi"]


def test_unknown_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--nope", "--", "true"])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_missing_command_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--memory", "1G"])
    assert exc.value.code == 2


def test_env_is_an_allowlist() -> None:
    caller = {
        "PATH": "/root/bin",
        "AWS_SECRET_ACCESS_KEY": "x",
        "TERM": "xterm",
        "LANG": "de_DE.UTF-8",
        "ANTHROPIC_API_KEY": "sk",
        "SSH_AUTH_SOCK": "/tmp/agent",
    }
    env = sandbox_env("/home/corral", caller)
    assert set(env) == {"PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "SHELL", "LANG", "TERM"}
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["LANG"] == "de_DE.UTF-8"


def test_validate_path_refusals(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    Path(home).mkdir()
    with pytest.raises(UsageError, match="cannot be /"):
        validate_path("/", "workspace", writable=True, home=home)
    with pytest.raises(UsageError, match="home directory"):
        validate_path(home, "workspace", writable=True, home=home)
    with pytest.raises(UsageError, match="home directory"):
        validate_path(str(tmp_path), "workspace", writable=True, home=home)
    with pytest.raises(UsageError, match="system directory"):
        validate_path("/usr/lib", "--rw path", writable=True, home=home)
    with pytest.raises(UsageError, match="does not exist"):
        validate_path(str(tmp_path / "nope"), "workspace", writable=True, home=home)
    assert validate_path("/usr/lib", "--ro path", writable=False, home=home) == "/usr/lib"


def test_validate_path_refuses_symlinks(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    link = tmp_path / "sneaky"
    link.symlink_to(home)
    with pytest.raises(UsageError, match=r"goes through the symlink .*sneaky"):
        validate_path(str(link), "workspace", writable=True, home=str(home))
    # `..` is resolved on real directories, so it cannot hide a home either.
    (home / "sub").mkdir()
    with pytest.raises(UsageError, match="home directory"):
        validate_path(str(home / "sub" / ".."), "workspace", writable=True, home=str(home))


def test_build_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    ws = tmp_path / "ws"
    ws.mkdir()
    ns, cmd = parse_args(
        [
            "--workspace",
            str(ws),
            "--memory",
            "256M",
            "--cpus",
            "0.5",
            "--pids",
            "64",
            "--timeout",
            "10m",
            "--ro",
            "/usr/share",
            "--",
            "true",
        ]
    )
    spec = build_spec(ns, cmd, {"SECRET": "x"})
    assert spec.workspace == str(ws)
    assert spec.limits.memory_bytes == 256 << 20
    assert spec.limits.cpus == 0.5
    assert spec.limits.pids == 64
    assert spec.limits.timeout_s == 600
    assert [b.path for b in spec.binds] == ["/usr/share"]
    assert "SECRET" not in dict(spec.env)


def test_only_degradable_layers_are_offered() -> None:
    from corral.errors import LayerUnavailableError

    assert "--allow-degraded cgroup" in str(
        LayerUnavailableError("cgroup", "not writable", "run as root", degradable=True)
    )
    assert "--allow-degraded" not in str(LayerUnavailableError("bwrap", "missing", "apt-get"))
    with pytest.raises(SystemExit) as exc:
        parse_args(["--allow-degraded", "bwrap", "--", "true"])
    assert exc.value.code == 2
    ns, _ = parse_args(["--allow-degraded", "landlock", "--", "true"])
    assert ns.allow_degraded == ["landlock"]


def test_rehearse_leaves_no_directory_and_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import tempfile

    from corral.exec import cli

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cli.rehearse()
    assert list(tmp_path.iterdir()) == []
    assert capfd.readouterr() == ("", "")


def test_a_failing_rehearsal_is_silent_and_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import tempfile

    from corral.exec import cli

    def refuse(*_args: object) -> None:
        raise UsageError("refused")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cli, "build_spec", refuse)
    cli.rehearse()
    assert list(tmp_path.iterdir()) == []
    assert capfd.readouterr() == ("", "")
