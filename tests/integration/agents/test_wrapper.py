"""The wrapper script really creates the config files and environment, byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from corral.agents.base import ConfigFile, Launch

NASTY = "a'b\"c $HOME `id` \\n %s %% \\\n-- end\nü\t"


def test_wrapper_writes_files_and_env_exactly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    probe = (
        "import json, os, sys; "
        "print(json.dumps({'cwd': os.getcwd(), 'x': os.environ.get('CORRAL_X'), "
        "'file': open(sys.argv[1]).read(), 'mode': oct(os.stat(sys.argv[1]).st_mode & 0o777), "
        "'argv': sys.argv[2:]}))"
    )
    target = str(home / ".cfg" / "deep" / "config")
    launch = Launch(
        argv=(sys.executable, "-c", probe, target, "-p", NASTY),
        env=(("CORRAL_X", NASTY),),
        cwd=str(ws),
        files=(ConfigFile(target, NASTY),),
    )
    out = subprocess.run(
        launch.wrapped_argv(),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
    )
    seen = json.loads(out.stdout)
    assert seen == {
        "cwd": str(ws),
        "x": NASTY,
        "file": NASTY,
        "mode": "0o600",
        "argv": ["-p", NASTY],
    }


def test_wrapper_stops_when_a_file_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    launch = Launch(
        argv=("/bin/sh", "-c", "echo RAN"),
        env=(),
        cwd=str(tmp_path),
        files=(ConfigFile(str(blocker / "sub" / "config"), "x"),),
    )
    out = subprocess.run(
        launch.wrapped_argv(), capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode != 0
    assert "RAN" not in out.stdout
