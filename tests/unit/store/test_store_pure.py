"""Pure parts of the store package: URL choice and the run-id gate before a path is made."""

from __future__ import annotations

import pytest

from corral.errors import CorralError, UsageError
from corral.store import store_url
from corral.store.worker import safe_run_id


def test_store_url_option_env_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_STORE", raising=False)
    assert store_url(None) is None
    assert store_url("sqlite:") is None
    assert store_url("postgresql:///c?host=/x") == "postgresql:///c?host=/x"
    monkeypatch.setenv("CORRAL_STORE", "postgresql://db/c")
    assert store_url(None) == "postgresql://db/c"
    assert store_url("sqlite:") is None  # the option wins over the environment
    with pytest.raises(UsageError):
        store_url("mysql://db")


@pytest.mark.parametrize("bad", ["../etc", "a/../../x", "", ".hidden", "a/b", "a\nb", "x" * 200])
def test_hostile_run_ids_never_become_paths(bad: str) -> None:
    with pytest.raises(CorralError):
        safe_run_id(bad)


def test_run_ids_corral_makes_pass() -> None:
    assert safe_run_id("todo-api-20261201-103000-ab12") == "todo-api-20261201-103000-ab12"
