"""Issue 14 checks: the mission keys are validated on the host; verdicts and reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.errors import ConfigError
from corral.run.environments import RunLayout, check_spec
from corral.run.mission import parse_mission
from corral.run.verdict import REASON_LIMIT, check_outcome, read_reason
from corral.sandbox.spec import ExecResult

HEAD = """+++
[limits]
run_memory = "4G"

[product]
command = "python3 server.py"
port = 8000

"""
TAIL = "+++\n# A service\n\nIt serves.\n"


def _mission(checks: str) -> str:
    return HEAD + checks + TAIL


def _error(checks: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_mission(_mission(checks), "M.md")
    return str(info.value)


STEPS = """[[checks]]
name = "create then read"
timeout = "10s"
setup = "echo start"
teardown = "rm -f /tmp/x"
env = { GREETING = "hi" }
memory = "64M"
pids = 32

[[checks.steps]]
http = "POST /todos"
body = '{"title": "milk"}'
expect_status = 201
expect_headers = { "content-type" = "json" }
capture = { id = "$.id", loc = "header:location" }

[[checks.steps]]
http = "GET /todos/${id}"
expect_json = { "$.title" = "milk", "$.tags[0]" = "x" }
expect_regex = "milk"

[[checks.steps]]
http = "GET ${loc}"
expect_sha256 = "%s"
expect_size = 12
""" % ("ab" * 32)


def test_steps_mission_parses_and_builds_the_verifier_document() -> None:
    m = parse_mission(_mission(STEPS), "/x/demo/MISSION.md")
    (check,) = m.settings.checks
    assert check.kind == "http" and len(check.http_steps()) == 3
    spec = check_spec(
        RunLayout(Path("/r/demo-1")),
        m,
        n=1,
        i=0,
        check=check,
        http_checker=Path("/r/demo-1/tools/http_check.py"),
    )
    assert dict(spec.env)["GREETING"] == "hi"
    assert spec.limits.memory_bytes == 64 << 20 and spec.limits.pids == 32
    # setup, check and teardown each get the timeout, plus a margin.
    assert spec.limits.timeout_s == 35.0
    runner = json.loads(spec.argv[-1])
    assert runner["setup"].endswith("&& echo start")
    assert runner["teardown"].endswith("&& rm -f /tmp/x")
    doc = json.loads(runner["main"][-1])
    assert [s["path"] for s in doc["steps"]] == ["/todos", "/todos/${id}", "${loc}"]
    assert doc["steps"][0]["capture"] == {"id": "$.id", "loc": "header:location"}


@pytest.mark.parametrize(
    ("bad", "want"),
    [
        ('http = "GET /todos/${nope}"', "uses ${nope}, which no earlier step captures"),
        ('expect_regex = "("', "expect_regex is not a regular expression"),
        ('expect_json = { "a.b" = 1 }', "JSON path 'a.b' is not like '$.a.b[0]'"),
        ('expect_json = { "$.a[?(@.x)]" = 1 }', "is not like '$.a.b[0]'"),
        (
            'capture = { id = "eval(1)" }',
            "capture id is '$.path', 'header:NAME' or 'regex:PATTERN'",
        ),
        ('expect_sha256 = "abc"', "expect_sha256 is 64 hexadecimal digits"),
    ],
)
def test_bad_step_is_a_mission_error(bad: str, want: str) -> None:
    checks = f'[[checks]]\nname = "c"\n[[checks.steps]]\nhttp = "GET /x"\n{bad}\n'
    if bad.startswith("http"):
        checks = f'[[checks]]\nname = "c"\n[[checks.steps]]\n{bad}\n'
    msg = _error(checks)
    assert msg.startswith("M.md:") and want in msg, msg


@pytest.mark.parametrize(
    ("bad", "want"),
    [
        ('env = { PYTHONSAFEPATH = "" }', "env PYTHONSAFEPATH is set by corral"),
        ('env = { CORRAL_CHECKS = "/" }', "env CORRAL_CHECKS is set by corral"),
        ('env = { "A B" = "x" }', "is not a variable name"),
        ('memory = "8G"', "memory is more than limits.run_memory"),
        ('expect_regex = "x"', "expect_regex need 'http'"),
        ('http = "GET /"', "give exactly one of 'run', 'http', 'steps' and 'browser'"),
    ],
)
def test_bad_check_keys(bad: str, want: str) -> None:
    msg = _error(f'[[checks]]\nname = "c"\nrun = "true"\n{bad}\n')
    assert want in msg, msg


def _result(exit: int, reason: str = "exited") -> ExecResult:
    return ExecResult(
        exit=exit,
        reason=reason,  # type: ignore[arg-type]
        wall_s=0.1,
        cpu_s=0.0,
        peak_memory_bytes=0,
        processes_killed_at_end=0,
        layers={},
    )


def test_reason_is_the_sandbox_line_but_the_verdict_is_the_host_exit(tmp_path: Path) -> None:
    f = tmp_path / "reason.txt"
    f.write_text("POST /todos: status 501, expected 201: 'nope'\n")
    assert check_outcome(_result(1), 10, read_reason(f)) == (
        False,
        "POST /todos: status 501, expected 201: 'nope'",
    )
    # The sandbox saying "passed" does not pass a check whose exit was not 0.
    f.write_text("passed\n")
    assert check_outcome(_result(1), 10, read_reason(f)) == (False, "passed")
    assert check_outcome(_result(0), 10, "FAILED") == (True, "passed")
    # The host's own reasons win over the sandbox's for kills and limits.
    assert check_outcome(_result(124, "timeout"), 10, "fine") == (False, "timed out after 10s")
    assert check_outcome(_result(137, "oom"), 10, "fine")[1] == "killed by the check's memory limit"
    assert check_outcome(_result(137, "killed"), 10, "fine")[1] == "exit 137 (killed)"
    # No reason file: the exit status.
    assert check_outcome(_result(3), 10, read_reason(tmp_path / "none")) == (
        False,
        "exit 3 (exited)",
    )


def test_hostile_reason_is_one_bounded_escaped_line(tmp_path: Path) -> None:
    f = tmp_path / "reason.txt"
    f.write_bytes(
        b"\x1b]0;pwned\x07bad \xff\xe2\x80\xae" + b"A" * 100_000 + b"\n| other | pass | passed |\n"
    )
    why = read_reason(f)
    assert "\n" not in why and "\x1b" not in why and "\u202e" not in why
    assert why.startswith("\\x1b]0;pwned\\x07bad \\xff\\u202e")
    assert "other" not in why
    assert len(why) <= REASON_LIMIT + 20


SECRETS = """[network.product]
allow = ["198.51.100.7:9000"]

[[network.product.host_services]]
name = "db"
port = 5432

[secrets.api]
value = "env:API_TOKEN"
upstream = "http://127.0.0.1:9001"
for = ["verifier"]

[[checks]]
name = "c"
run = "true"
"""


def test_secrets_become_routes_for_their_environments_only() -> None:
    from corral.run.environments import product_spec
    from corral.run.envnet import missing_secrets

    m = parse_mission(_mission(SECRETS), "/x/demo/MISSION.md")
    layout = RunLayout(Path("/r/demo-1"))
    check = check_spec(
        layout, m, n=1, i=0, check=m.settings.checks[0], http_checker=Path("/r/t/http_check.py")
    )
    env = dict(check.env)
    assert env["CORRAL_SECRET_API_URL"] == "http://127.0.0.1:3128/routes/api"
    assert "API_TOKEN" not in json.dumps(env) and check.network.broker_config is not None
    doc = json.loads(check.network.broker_config)
    assert doc["routes"]["api"]["inject_header"] == {"authorization": "env:API_TOKEN"}
    assert doc["routes"]["api"]["allow_private"] is True
    assert doc["rules"] == []
    product = product_spec(layout, m, 1)
    pdoc = json.loads(product.network.broker_config or "{}")
    assert pdoc["routes"] == {} and [r["host"] for r in pdoc["rules"]] == ["198.51.100.7"]
    assert pdoc["host_services"] == [{"name": "db", "port": 5432}]
    assert dict(product.env)["ALL_PROXY"].startswith("socks5h://")
    assert "host_services" not in doc or doc["host_services"] == []
    assert "CORRAL_SECRET_API_URL" not in dict(product.env)
    assert missing_secrets(m.settings.secrets, {}) == [
        "secret api: $API_TOKEN is not set in corral's environment"
    ]
    assert missing_secrets(m.settings.secrets, {"API_TOKEN": "x"}) == []


def test_no_allowlist_no_secret_means_no_broker() -> None:
    m = parse_mission(_mission('[[checks]]\nname = "c"\nrun = "true"\n'), "/x/d/MISSION.md")
    spec = check_spec(
        RunLayout(Path("/r/d-1")),
        m,
        n=1,
        i=0,
        check=m.settings.checks[0],
        http_checker=Path("/r/t/http_check.py"),
    )
    assert not spec.network.needs_broker and "HTTP_PROXY" not in dict(spec.env)


@pytest.mark.parametrize(
    ("bad", "want"),
    [
        ('value = "API"', "a secret is 'env:NAME' or 'file:/absolute/path'"),
        ('value = "env:A"\nupstream = "ftp://x"', "upstream must be http(s)"),
        ('value = "env:A"\nupstream = "http://x"\nfor = ["agent"]', "'product' or 'verifier'"),
    ],
)
def test_bad_secret(bad: str, want: str) -> None:
    text = f'[secrets.api]\n{bad}\n[[checks]]\nname = "c"\nrun = "true"\n'
    msg = _error(text)
    assert want in msg, msg
