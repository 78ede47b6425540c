"""`[[checks]] browser`: where the script may lie, and the verifier spec it gets (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.errors import ConfigError
from corral.run.environments import RunLayout, check_spec
from corral.run.mission import browser_in_checks, parse_mission

MISSION = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
checks_dir = "checks"

[product]
command = "python3 server.py"
port = 8000

[[checks]]
name = "ui"
browser = "BROWSER"
timeout = "30s"
+++
# A page
"""


def _mission(browser: str, extra: str = "") -> str:
    return MISSION.replace("BROWSER", browser).replace(
        'checks_dir = "checks"', extra or 'checks_dir = "checks"'
    )


@pytest.mark.parametrize(
    ("browser", "why"),
    [
        ("/etc/test_ui.py", "relative path"),
        ("checks/../server.py", "relative path"),
        ("checks/test_ui.sh", "relative path"),
        # The agent's workspace is not the mission's checks dir.
        ("workspace/test_ui.py", "must lie in checks_dir"),
        ("test_ui.py", "must lie in checks_dir"),
    ],
)
def test_the_script_must_be_the_missions(browser: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mission(_mission(browser), "M.md")
    assert why in str(info.value)


def test_without_checks_dir_or_product_it_is_refused() -> None:
    with pytest.raises(ConfigError, match="must lie in checks_dir"):
        parse_mission(_mission("checks/t.py", extra="max_sessions = 1"), "M.md")
    no_product = _mission("checks/t.py").replace(
        '[product]\ncommand = "python3 server.py"\nport = 8000\n', ""
    )
    with pytest.raises(ConfigError, match="browser checks need a"):
        parse_mission(no_product, "M.md")


def test_browser_in_checks() -> None:
    assert browser_in_checks("checks/ui/t.py", "checks") == "ui/t.py"
    assert browser_in_checks("./checks/t.py", "checks/") == "t.py"
    assert browser_in_checks("checks", "checks") is None
    assert browser_in_checks("other/t.py", "checks") is None


def test_the_verifier_runs_the_run_copy_with_playwright_read_only() -> None:
    mission = parse_mission(_mission("checks/ui/test_ui.py"), "/m/MISSION.md")
    layout = RunLayout(Path("/r/demo-1"))
    site = Path("/venv/lib/python3.11/site-packages")
    spec = check_spec(
        layout,
        mission,
        n=2,
        i=0,
        check=mission.settings.checks[0],
        http_checker=layout.tools / "http_check.py",
        playwright_site=site,
    )
    # Every check goes through check_run.py (setup/teardown, the reason line);
    # its `main` is the browser runner with its own JSON document.
    run_doc = json.loads(next(a for a in spec.argv if a.startswith("{")))
    main = run_doc["main"]
    assert main[2] == str(layout.tools / "browser_check.py") and run_doc["http"] is False
    got = json.loads(main[3])
    # The script is the run's copy of the mission's checks dir, never the snapshot's.
    assert got["script"] == str(layout.checks / "ui" / "test_ui.py")
    assert not got["script"].startswith(str(layout.snapshot(2)))
    assert got["site"] == str(site) and got["timeout"] < 30
    assert str(layout.tools / "check_run.py") in spec.argv
    binds = {b.path: b.writable for b in spec.binds}
    assert binds[str(site)] is False and binds[str(layout.tools)] is False
    assert not any(binds.values())
    assert spec.env_kind == "verifier" and spec.network.allow == ()
    env = dict(spec.env)
    assert env["PYTHONSAFEPATH"] == "1" and env["PRODUCT_URL"] == "http://127.0.0.1:8000"


def test_no_playwright_is_refused() -> None:
    mission = parse_mission(_mission("checks/t.py"), "/m/MISSION.md")
    layout = RunLayout(Path("/r/demo-1"))
    with pytest.raises(ConfigError):
        check_spec(
            layout,
            mission,
            n=1,
            i=0,
            check=mission.settings.checks[0],
            http_checker=layout.tools / "http_check.py",
        )
