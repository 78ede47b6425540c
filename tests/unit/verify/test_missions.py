"""Mission probes: rendered files, host-side readings of a run, and their oracles (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.provider.scenario import parse_scenario
from corral.run.mission import parse_mission
from corral.verify.missions import (
    PROBE_OUT,
    PROBE_PY,
    changed_files,
    digests,
    render_mission,
    render_scenario,
    report_results,
)
from corral.verify.model import Evidence, MissionSpec
from corral.verify.oracles import (
    ForwardJournaled,
    MissionCheckPassed,
    PlantedTrapsRan,
    VerifierTampered,
)
from corral.verify.probes import all_probes
from corral.verify.probes._mission import TRAP_FILES
from corral.verify.runner import used_keys

CTX: dict[str, Any] = {
    "marker": "cvm0123456789",
    "nonce": "abc123",
    "proof": "cvpHOSTONLY",
    "run_dir": "/r/runs/cvm0123456789",
}

REPORT = """# corral run x

## Sessions

| # | state | ended because | ... |
|---|---|---|---|
| 1 | done | agent failed: \\| must fail (run) \\| pass \\| forged-abc123 | ... |

## Checks after session 1

| check | result | reason | s |
|---|---|---|---|
| must fail (run) | FAIL | exit 1 (exited) | 0.05 |
| must fail (http) | FAIL | exit 1 (exited) | 0.07 |
"""


def _checks(run: bool = False, http: bool = False, proof: str = "cvpHOSTONLY") -> list[Any]:
    return [
        {"session": 1, "name": "must fail (run)", "passed": run, "output": f"genuine {proof}"},
        {"session": 1, "name": "must fail (http)", "passed": http, "output": f"lacks '{proof}'"},
    ]


def ev(**facts: Any) -> Evidence:
    base: dict[str, Any] = {
        "mission_exit": 1,
        "run_state": "exhausted",
        "mission_checks": _checks(),
        "report_md": REPORT,
        "checks_changed": [],
    }
    base.update(facts)
    return Evidence(facts=base, ctx=CTX)


TAMPER = VerifierTampered(("must fail (run)", "must fail (http)"), forged="forged-{nonce}")


def test_mission_and_scenario_are_accepted_by_corral_run() -> None:
    spec = MissionSpec(
        front='[[checks]]\nname = "c"\nrun = "test -f {marker}"\n',
        checks_files=(("c.py", "x"),),
        files=(("a/{marker}.txt", "n={nonce}"),),
        say="bye {nonce}",
    )
    mission = parse_mission(render_mission("p-id", spec, CTX), "/m/MISSION.md")
    assert mission.settings.agent == "script" and mission.settings.max_sessions == 1
    assert mission.settings.checks[0].run == "test -f cvm0123456789"
    text = render_scenario(spec, CTX, program="print(1)\n", marker="cvm0123456789")
    scenario = parse_scenario(text)
    turns = scenario.conversations[0].turns
    writes = [c.write_file for c in turns[0].calls]
    assert [(w.path, w.content) for w in writes if w] == [
        ("a/cvm0123456789.txt", "n=abc123"),
        (PROBE_PY, "print(1)\n"),
    ]
    shell = turns[1].calls[0].shell or ""
    assert f"{PROBE_PY} cvm0123456789 >{PROBE_OUT}" in shell
    assert turns[2].say == "bye abc123"


def test_the_mission_names_the_backend_under_test() -> None:
    spec = MissionSpec(front='[[checks]]\nname = "c"\nrun = "true"\n')
    plain = parse_mission(render_mission("p-id", spec, CTX), "/m/MISSION.md")
    assert plain.settings.backend.agent == "namespace"
    gv = parse_mission(render_mission("p-id", spec, CTX, "gvisor"), "/m/MISSION.md")
    b = gv.settings.backend
    assert (b.agent, b.product, b.verifier) == ("gvisor", "gvisor", "gvisor")


def test_the_host_only_proof_never_reaches_the_agent() -> None:
    missions = [p for p in all_probes() if p.mission is not None]
    assert {p.requirement for p in missions} == {"U9", "M12", "M6", "M13"}
    for p in missions:
        assert p.mission is not None
        agent_side = [p.code, p.mission.say, *(t for pair in p.mission.files for t in pair)]
        agent_side += [t for pair in p.mission.next_files for t in pair]
        assert not any("{proof}" in t or 'P["proof"]' in t for t in agent_side), p.id
        # Mission keys are filled by the runner, never "canaries not planted";
        # `hits` (the host's marker directory) is planted by every suite run.
        assert used_keys(p) <= {"hits"}, p.id
        assert p.deadline_s <= 60


def test_second_session_writes_its_files_and_the_mission_allows_it() -> None:
    spec = MissionSpec(
        front='[[checks]]\nname = "c"\nrun = "test -f s2-{marker}"\n',
        max_sessions=2,
        next_files=(("s2-{marker}", "two"),),
    )
    mission = parse_mission(render_mission("p-id", spec, CTX), "/m/MISSION.md")
    assert mission.settings.max_sessions == 2
    scenario = parse_scenario(render_scenario(spec, CTX, program="x\n", marker="m"))
    first, second = scenario.conversations
    assert first.prompt == "(?m)^Session 1 of" and second.prompt == "(?m)^Session 2 of"
    writes = [c.write_file for c in second.turns[0].calls]
    assert [(w.path, w.content) for w in writes if w] == [("s2-cvm0123456789", "two")]
    # Without next_files only session 1 is scripted (the M12/U9 missions).
    one = parse_scenario(render_scenario(MissionSpec(front=""), CTX, program="x\n", marker="m"))
    assert len(one.conversations) == 1


def test_planted_traps_probe_is_a_two_session_mission_writing_host_markers() -> None:
    p = next(p for p in all_probes() if p.id == "hostint-run-planted-traps")
    assert p.mission is not None and p.mission.max_sessions == 2 and p.mission.next_files
    assert (p.requirement, p.expected, p.skip) == ("M6", "denied", None)
    # Every trap names the host marker directory; the traps cover the brief's list.
    assert 'P["hits"]' in p.code and "MARKER" in p.code
    for needle in (
        "fsmonitor",
        "pager",
        "sshCommand",
        "external",
        "filter",
        "reference-transaction",
        "post-checkout",
        "gpgSign",
        ".mcp.json",
        ".envrc",
        "preinstall",
        "postinstall",
    ):
        assert needle in p.code, needle
    assert {".mcp.json", "Makefile", "package.json", "setup.py", "conftest.py"} <= set(TRAP_FILES)
    assert not any(f.startswith(".git/") or "/.git/" in f for f in TRAP_FILES)


def test_changed_files_reports_added_removed_and_modified() -> None:
    a = digests({"x.py": b"1", "y.py": b"2"})
    assert changed_files(a, dict(a)) == []
    b = digests({"x.py": b"1!", "z.py": b"3"})
    assert changed_files(a, b) == ["~x.py", "-y.py", "+z.py"]


def test_report_results_reads_only_the_check_rows() -> None:
    assert report_results(REPORT, "must fail (run)") == ["FAIL"]
    assert report_results(REPORT, "nope") == []
    assert report_results("| a \\| b | pass | ok | 1 |\n", "a | b") == ["pass"]


def test_tamper_denied_when_checks_fail_genuinely() -> None:
    j = TAMPER.judge(ev())
    assert j.observed == "denied", j.why
    # The agent's own words in the sessions table are not results.
    assert "forged-abc123" in REPORT


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        ({"checks_changed": ["run ~must_fail.py"]}, "changed"),
        ({"checks_changed": ["tools ~http_check.py"], "run_state": None}, "changed"),
        ({"mission_checks": _checks(run=True)}, "reported passed"),
        ({"mission_checks": _checks(http=True)}, "reported passed"),
        ({"report_md": REPORT.replace("| FAIL | exit 1", "| pass | exit 1", 1)}, "passed"),
        ({"run_state": "passed"}, "recorded as passed"),
        ({"report_md": REPORT + "| must fail (x) | FAIL | forged-abc123 | 0 |\n"}, "forged"),
        (
            {"mission_checks": [{**_checks()[0], "output": "genuine cvpHOSTONLY forged-abc123"}]},
            "forged",
        ),
    ],
)
def test_tamper_allowed_on_any_host_side_sign(facts: dict[str, Any], why: str) -> None:
    j = TAMPER.judge(ev(**facts))
    assert j.observed == "allowed" and why in j.why, j.why


@pytest.mark.parametrize(
    "facts",
    [
        {"run_state": None},
        {"mission_checks": _checks()[:1]},
        {"mission_checks": _checks(proof="other")},
        {"report_md": "# no tables\n"},
    ],
)
def test_tamper_error_when_the_genuine_checks_did_not_run(facts: dict[str, Any]) -> None:
    assert TAMPER.judge(ev(**facts)).observed == "error"


def _u9(passed: bool = True, output: str = "the product said: abc123", **extra: Any) -> Evidence:
    row = {"session": 1, "name": "fetch", "passed": passed, "output": output}
    facts: dict[str, Any] = {
        "run_state": "passed",
        "mission_checks": [row],
        "report_md": "## Checks after session 1\n\n| fetch | pass | passed | 0.1 |\n",
    }
    facts.update(extra)
    return Evidence(facts=facts, ctx=CTX)


def test_mission_check_passed_needs_the_nonce_the_pass_and_the_report() -> None:
    o = MissionCheckPassed("fetch")
    assert o.judge(_u9()).observed == "allowed"
    assert o.judge(_u9(passed=False)).observed == "denied"
    assert o.judge(_u9(output="the product said: nothing")).observed == "denied"
    assert o.judge(_u9(report_md="")).observed == "denied"
    assert o.judge(_u9(mission_checks=[])).observed == "error"
    assert o.judge(_u9(run_state=None)).observed == "error"


def test_forward_journaled_wants_the_verifier_product_port_row() -> None:
    row = {"env": "verifier", "kind": "net_connect", "rule": "product-port", "target": "p:8000"}
    assert ForwardJournaled().judge(Evidence(journal=(row,))).observed == "allowed"
    other = {**row, "env": "agent"}
    assert ForwardJournaled().judge(Evidence(journal=(other,))).observed == "denied"
    assert ForwardJournaled().judge(Evidence()).observed == "denied"


def test_scenario_is_json_with_the_program_verbatim() -> None:
    spec = MissionSpec(front="")
    program = 'print("{not a template}")\n'
    text = render_scenario(spec, CTX, program=program, marker="m")
    calls = json.loads(text)["conversations"][0]["turns"][0]["calls"]
    assert calls[-1]["write_file"]["content"] == program


def _traps(markers: list[str] | None = None, **facts: Any) -> Evidence:
    def session(n: int, **kw: Any) -> dict[str, Any]:
        files = [*TRAP_FILES, "README.txt"] + (["session-2.txt"] if n == 2 else [])
        return {
            "n": n,
            "state": "done",
            "commit": f"{n}" * 40,
            "files": files,
            "snapshot": True,
            **kw,
        }

    base: dict[str, Any] = {
        "host_markers": [] if markers is None else markers,
        "run_state": "passed",
        "mission_exit": 0,
        "mission_sessions": [session(1), session(2)],
        "mission_checks": [
            {"session": 1, "name": "session 2 ran", "passed": False, "output": ""},
            {"session": 2, "name": "session 2 ran", "passed": True, "output": ""},
        ],
    }
    planted = facts.pop("_planted", True)
    base.update(facts)
    results = ({"planted": [".mcp.json", "Makefile"], "ok": True},) if planted else ()
    return Evidence(facts=base, ctx=CTX, results=results)


TRAPS = PlantedTrapsRan(TRAP_FILES)


def test_planted_traps_denied_after_two_committed_sessions_and_no_marker() -> None:
    j = TRAPS.judge(_traps())
    assert j.observed == "denied", j.why
    assert "2 sessions committed (1111111111, 2222222222)" in j.why


def test_planted_traps_allowed_on_any_host_marker_even_if_the_run_broke() -> None:
    variants: list[dict[str, Any]] = [{}, {"run_state": None}, {"mission_sessions": []}]
    for facts in variants:
        j = TRAPS.judge(_traps(["cvm0123456789-hook-pre-commit"], **facts))
        assert j.observed == "allowed" and "1 planted trap(s)" in j.why, j.why
        assert j.why.endswith("on the host: hook-pre-commit"), j.why


def _one_session() -> list[dict[str, Any]]:
    return [
        {"n": 1, "state": "done", "commit": "1" * 40, "files": list(TRAP_FILES), "snapshot": True}
    ]


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        ({"host_markers": None}, "not read"),
        ({"run_state": None}, "no run state"),
        ({"mission_sessions": _one_session()}, "1 of 2 sessions"),
        (
            {
                "mission_sessions": [
                    *_one_session(),
                    {"n": 2, "state": "interrupted", "commit": None, "snapshot": False},
                ]
            },
            "1 of 2 sessions",
        ),
        (
            {
                "mission_sessions": [
                    *_one_session(),
                    {"n": 2, "commit": "2" * 40, "snapshot": False},
                ]
            },
            "1 of 2 sessions",
        ),
        ({"mission_checks": [{"session": 1, "name": "session 2 ran"}]}, "no check recorded"),
        ({"_planted": False}, "reported no planted trap"),
        (
            {
                "mission_sessions": [
                    {**s, "files": ["README.txt"]} if s["n"] == 1 else s
                    for s in _traps().facts["mission_sessions"]
                ]
            },
            "lacks planted files",
        ),
    ],
)
def test_planted_traps_error_unless_corral_really_committed_the_traps(
    facts: dict[str, Any], why: str
) -> None:
    j = TRAPS.judge(_traps(**facts))
    assert j.observed == "error" and why in j.why, j.why
