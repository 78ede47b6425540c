"""Mission files: valid ones parse; each kind of error names its line and problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import ConfigError
from corral.run.mission import load_mission, parse_mission, parse_provider

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

GOOD = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = 2

[session]
wall_time = "90s"

[limits]
run_memory = "1G"
agent = { memory = "512M", pids = 128 }

[product]
command = "python3 server.py"
port = 8000

[[checks]]
name = "health"
http = "GET /health"

[[checks]]
name = "tests"
run = "python3 -m pytest -q"
timeout = "30s"
+++
# A service

It serves things.
"""


def test_good_mission_parses() -> None:
    m = parse_mission(GOOD, "/x/demo/MISSION.md")
    s = m.settings
    assert m.name == "demo"
    assert s.session.wall_time == 90.0
    assert s.limits.run_memory == 1 << 30
    assert s.limits.agent.memory == 512 << 20 and s.limits.agent.pids == 128
    assert [c.kind for c in s.checks] == ["http", "run"]
    assert s.checks[1].timeout == 30.0
    assert m.description.startswith("# A service")
    assert m.scenario_path == Path("/x/demo/scenario.yaml")


@pytest.mark.parametrize("example", ["todo-cli", "todo-api", "todo-steps", "todo-ui"])
def test_examples_load(example: str) -> None:
    m = load_mission(EXAMPLES / example / "MISSION.md")
    assert m.name == example
    assert m.scenario_path is not None and m.scenario_path.is_file()


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_mission(text, "M.md")
    return str(info.value)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_unknown_top_level_key_names_its_line() -> None:
    text = GOOD.replace("max_sessions = 2\n", "max_sessions = 2\nmax_sesions = 3\n")
    assert _error(text) == f"M.md:{_line_of(text, 'max_sesions')}: unknown key 'max_sesions'"


def test_unknown_nested_key_names_its_line() -> None:
    text = GOOD.replace('wall_time = "90s"\n', 'wall_time = "90s"\nwalltime = 3\n')
    assert _error(text) == f"M.md:{_line_of(text, 'walltime')}: unknown key 'session.walltime'"


def test_bad_size_names_line_and_value() -> None:
    text = GOOD.replace('run_memory = "1G"', 'run_memory = "lots"')
    msg = _error(text)
    assert msg.startswith(f"M.md:{_line_of(text, 'run_memory')}: 'limits.run_memory':")
    assert "invalid size 'lots'" in msg


def test_bad_duration() -> None:
    text = GOOD.replace('wall_time = "90s"', 'wall_time = "soon"')
    msg = _error(text)
    assert msg.startswith(f"M.md:{_line_of(text, 'wall_time')}: 'session.wall_time':")


def test_bad_port() -> None:
    text = GOOD.replace("port = 8000", "port = 80")
    msg = _error(text)
    assert msg.startswith(f"M.md:{_line_of(text, 'port = 80')}: 'product.port':")


def test_bad_value_in_second_check_points_at_it() -> None:
    text = GOOD.replace('timeout = "30s"', 'timeout = "-1"')
    msg = _error(text)
    assert msg.startswith(f"M.md:{_line_of(text, 'timeout = ')}: 'checks[1].timeout':")


def test_check_needs_exactly_one_of_run_and_http() -> None:
    text = GOOD.replace('run = "python3 -m pytest -q"\n', "")
    assert "give exactly one of 'run', 'http', 'steps' and 'browser'" in _error(text)


def test_malformed_http_check() -> None:
    assert "METHOD /path" in _error(GOOD.replace('"GET /health"', '"FETCH health"'))


def test_http_check_without_product() -> None:
    start = GOOD.index("[product]")
    end = GOOD.index("[[checks]]")
    assert "http checks need a [product] section" in _error(GOOD[:start] + GOOD[end:])


def test_unknown_agent() -> None:
    text = GOOD.replace('agent = "script"', 'agent = "clippy"')
    msg = _error(text)
    assert msg.startswith(f"M.md:{_line_of(text, 'clippy')}: 'agent':")


def test_bad_provider() -> None:
    assert "provider is 'synthetic:FILE'" in _error(GOOD.replace("synthetic:scenario.yaml", "x"))


def test_bad_allowlist_entry() -> None:
    text = GOOD.replace("[session]", '[network]\nallow = ["*"]\n\n[session]')
    msg = _error(text)
    assert msg.startswith(f"M.md:{_line_of(text, 'allow = ')}: 'network.allow':")


def test_env_memory_above_run_cap() -> None:
    text = GOOD.replace('memory = "512M"', 'memory = "2G"')
    err = _error(text)
    assert f"M.md:{_line_of(text, 'run_memory')}: 'limits': run_memory = 1G is less than" in err
    assert "limits.agent.memory = 2G;" in err and "must be at least 2G" in err


def test_run_memory_below_a_default_names_the_key_and_minimum_in_units() -> None:
    text = GOOD.replace('run_memory = "1G"', 'run_memory = "1K"').replace(
        'agent = { memory = "512M", pids = 128 }\n', ""
    )
    err = _error(text)
    assert err.startswith(f"M.md:{_line_of(text, 'run_memory')}: 'limits': run_memory = 1K")
    assert "limits.agent.memory = 2G (the default)" in err
    assert "limits.run_memory must be at least 2G" in err
    assert "bytes" not in err and "2147483648" not in err


def test_missing_checks_is_reported_at_the_front_matter() -> None:
    text = GOOD.split("[[checks]]", maxsplit=1)[0] + "+++\nbody\n"
    assert _error(text) == "M.md:1: missing required key 'checks'"


def test_toml_syntax_error_line_is_in_the_file() -> None:
    text = GOOD.replace("max_sessions = 2", "max_sessions = = 2")
    assert _error(text).startswith(f"M.md:{_line_of(text, 'max_sessions')}: TOML syntax error")


def test_missing_front_matter() -> None:
    assert "front matter between '+++'" in _error("# just markdown\n")


def test_unclosed_front_matter() -> None:
    assert "closing '+++' is missing" in _error('+++\nagent = "script"\n# no end\n')


def test_missing_checks() -> None:
    assert "missing required key 'checks'" in _error('+++\nagent = "script"\n+++\n# x\n')


def test_empty_description() -> None:
    assert "no product description" in _error(GOOD[: GOOD.index("# A service")])


def test_duplicate_check_names() -> None:
    text = GOOD.replace('name = "tests"', 'name = "health"')
    lines = [i for i, t in enumerate(text.splitlines(), 1) if t == 'name = "health"']
    assert _error(text) == (
        f"M.md:{lines[1]}: duplicate check name 'health' (first used on line {lines[0]})"
    )


def test_every_error_is_reported() -> None:
    text = GOOD.replace("max_sessions = 2", "max_sessions = 0\nbogus = 1")
    lines = _error(text).splitlines()
    assert len(lines) == 2


def test_parse_provider() -> None:
    assert parse_provider("anthropic").kind == "anthropic"
    assert parse_provider("synthetic:a.yaml").scenario == "a.yaml"
    assert parse_provider("gemini").kind == "gemini"  # `gemini` runs in `corral run` too
    with pytest.raises(ValueError):
        parse_provider("mistral")


def test_load_missing_scenario(tmp_path: Path) -> None:
    (tmp_path / "MISSION.md").write_text(GOOD)
    with pytest.raises(ConfigError, match=r"scenario .* does not exist"):
        load_mission(tmp_path / "MISSION.md")
