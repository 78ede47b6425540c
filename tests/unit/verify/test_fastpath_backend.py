"""`corral verify --backend fastpath`: the command line and the front end's environment (pure)."""

from __future__ import annotations

import pytest

from corral.verify.backends import BACKENDS, CorralBackend, RunSpec, make_backend
from corral.verify.model import ProbeLimits


def test_fastpath_runs_the_front_end_on_the_namespace_backend() -> None:
    b = make_backend("fastpath")
    assert isinstance(b, CorralBackend) and "fastpath" in BACKENDS
    b.frontend = "/cache/corral-frontend-x"
    argv = b.argv(["true"], RunSpec("/w", ProbeLimits(memory="64M")))
    assert argv[:2] == ["/cache/corral-frontend-x", "exec"]
    assert "--backend" not in argv and argv[argv.index("--memory") + 1] == "64M"
    assert argv[-2:] == ["--", "true"]


def test_fastpath_needs_its_session_first() -> None:
    with pytest.raises(AssertionError, match="session"):
        make_backend("fastpath").argv(["true"], RunSpec("/w", ProbeLimits()))


def test_only_the_fast_path_sets_the_launcher_environment() -> None:
    b = make_backend("fastpath")
    assert isinstance(b, CorralBackend)
    b.launcher_socket = "/tmp/cv-1/l.sock"
    assert b.exec_env() == {
        "CORRAL_LAUNCHER": "require",
        "CORRAL_LAUNCHER_SOCKET": "/tmp/cv-1/l.sock",
    }
    assert make_backend("namespace").exec_env() == {} == make_backend("none").exec_env()
