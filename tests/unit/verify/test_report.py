"""Requirement verdicts and the three renderings of a report."""

from __future__ import annotations

import json

from rich.console import Console

from corral.verify.model import (
    MANDATORY,
    REQUIREMENTS,
    Observed,
    Probe,
    ProbeResult,
    Skipped,
    Verdict,
)
from corral.verify.oracles import Survived
from corral.verify.report import (
    Report,
    judge_requirements,
    render,
    summary_line,
    to_json,
    to_markdown,
)


def probe(pid: str, req: str = "M5") -> Probe:
    return Probe(pid, "processes", req, f"{pid} description", "pass\n", Survived())


def result(pid: str, observed: Observed, v: Verdict, req: str = "M5") -> ProbeResult:
    return ProbeResult(probe(pid, req), observed, v, f"evidence of {pid} | [::1]", 0.1, {"exit": 0})


def verdicts(
    results: list[ProbeResult],
    skipped: list[Skipped] | None = None,
    na: dict[str, str] | None = None,
) -> dict[str, tuple[str, str]]:
    return {
        v.id: (v.status, v.reason) for v in judge_requirements(results, skipped or [], na or {})
    }


def test_every_requirement_gets_a_verdict() -> None:
    assert list(verdicts([])) == list(REQUIREMENTS)
    assert all(status == "not-tested" for status, _ in verdicts([]).values())


def test_met_only_when_every_probe_ran_ok() -> None:
    v = verdicts([result("a", "denied", "ok"), result("b", "denied", "ok")])
    assert v["M5"] == ("met", "2 probes ok")


def test_one_unexpected_fails_the_requirement() -> None:
    v = verdicts([result("a", "denied", "ok"), result("b", "allowed", "unexpected")])
    assert v["M5"][0] == "failed" and "b" in v["M5"][1]


def test_untested_probe_keeps_it_from_met() -> None:
    sk = Skipped(probe("c"), "not-tested", "broker not built")
    v = verdicts([result("a", "denied", "ok")], [sk])
    assert v["M5"][0] == "not-tested" and "broker not built" in v["M5"][1]


def test_not_applicable_probe_does_not_block_met() -> None:
    sk = Skipped(probe("c"), "not-applicable", "no /srv here")
    assert verdicts([result("a", "denied", "ok")], [sk])["M5"][0] == "met"
    assert verdicts([], [sk])["M5"] == ("not-applicable", "no /srv here")


def test_broken_probe_means_not_tested() -> None:
    v = verdicts([result("a", "denied", "broken-probe")])
    assert v["M5"][0] == "not-tested" and "broken" in v["M5"][1]


def test_backend_not_applicable_wins() -> None:
    v = verdicts([result("a", "allowed", "unexpected", "M11")], na={"M11": "no viewer"})
    assert v["M11"] == ("not-applicable", "no viewer")


def make_report(results: list[ProbeResult], skipped: list[Skipped] | None = None) -> Report:
    sk = skipped or []
    return Report(
        "namespace",
        "agent",
        "2025-01-01T00:00:00+00:00",
        12.5,
        tuple(results),
        tuple(sk),
        judge_requirements(results, sk, {}),
        ("workdir: /x",),
    )


def test_exit_code_follows_mandatory_failures_only() -> None:
    assert make_report([result("a", "denied", "ok")]).exit_code == 0
    assert make_report([result("a", "allowed", "unexpected")]).exit_code == 1
    assert make_report([result("u", "denied", "unexpected", "U2")]).exit_code == 0


def test_summary_line() -> None:
    rep = make_report(
        [
            result("a", "denied", "ok"),
            result("b", "allowed", "unexpected"),
            result("c", "error", "unexpected"),
        ]
    )
    assert summary_line(rep).startswith("3 observations: 1 allowed, 1 denied, 2 unexpected")
    assert "1 errors" in summary_line(rep)


def test_json_shape_follows_design_section_6() -> None:
    sk = Skipped(probe("s", "M9"), "not-tested", "no journal yet")
    doc = to_json(make_report([result("a", "denied", "ok")], [sk]))
    json.dumps(doc)
    assert doc["backend"] == "namespace"
    assert set(doc["summary"]) >= {"observations", "allowed", "denied", "unexpected"}
    assert set(doc["requirements"]) == set(REQUIREMENTS)
    assert set(doc["requirements"].values()) <= {"met", "failed", "not-applicable", "not-tested"}
    (p,) = doc["probes"]
    assert {"id", "category", "requirement", "expected", "observed", "verdict", "evidence"} <= set(
        p
    )
    assert p["raw"] == {"exit": 0}
    assert doc["not_run"][0]["reason"] == "no journal yet"
    assert set(MANDATORY) <= set(doc["requirements"])


def test_markdown_has_tables_and_escapes_pipes() -> None:
    md = to_markdown(make_report([result("a", "denied", "ok")]))
    assert "| probe | category | req | expected | observed | verdict | evidence |" in md
    assert "evidence of a \\| \\[\\:\\:1\\]" in md  # inert Markdown (corral.display.md)
    assert "| M5 | processes | met |" in md


def test_render_prints_table_summary_and_requirement_lines() -> None:
    console = Console(record=True, width=200)
    render(
        make_report([result("a", "denied", "ok"), result("b", "allowed", "unexpected")]), console
    )
    text = console.export_text()
    assert "2 observations: 1 allowed, 1 denied, 1 unexpected" in text
    assert "M5 processes: FAILED" in text
    assert "b (M5, unexpected): evidence of b | [::1]" in text
