"""A run directory written the way the coordinator writes one, full of agent-chosen markup."""

from __future__ import annotations

import json
from pathlib import Path

from corral.broker.actions import Observation
from corral.broker.journal import Journal
from corral.hostgit import TrustedRepo
from corral.run.store import CheckResult, Store

#: Each payload, rendered as HTML, would add an element with id inj-* or set window.__xss.
FILE_NAME = '<img id="inj-file" src=x onerror="window.__xss=1;alert(1)">'
CHECK_OUTPUT = '</script><script>window.__xss=2;alert(2)</script><b id="inj-check">b</b>'
JOURNAL_TARGET = '<a id="inj-journal" href="javascript:alert(3)">evil.example</a>'
SUMMARY = '<svg id="inj-summary" onload="window.__xss=4;alert(4)"></svg>**bold**'
RULE = '<i id="inj-rule">rule</i>'
FILE_TEXT = '<iframe id="inj-diff" src="javascript:alert(5)"></iframe>'
PAYLOADS = (FILE_NAME, CHECK_OUTPUT, JOURNAL_TARGET, SUMMARY, RULE, FILE_TEXT)
INJECTED_IDS = ("inj-file", "inj-check", "inj-journal", "inj-summary", "inj-rule", "inj-diff")


def hostile_run(runs: Path, run_id: str = "hostile") -> Path:
    root = runs / run_id
    (root / "workspace").mkdir(parents=True)
    repo = TrustedRepo(root / "git", root / "workspace")
    repo.init()
    (root / "workspace" / "README").write_text("start\n")
    base = repo.commit_all("base")
    (root / "workspace" / FILE_NAME).write_text(FILE_TEXT + "\n")
    head = repo.commit_all("session 1")
    with Store(root / "state.sqlite") as store:
        store.create_run(
            run_id,
            mission="m",
            agent="script",
            provider="synthetic",
            max_sessions=3,
            memory_cap=1 << 30,
        )
        store.update_run(base_commit=base, last_commit=head, peak_memory=42 << 20)
        store.begin_session(1)
        store.record_checks(1, [CheckResult("ui", False, "exit 1", 1, 0.5, CHECK_OUTPUT)])
        store.end_session(
            1, state="done", end_reason="agent done", commit_sha=head, summary=SUMMARY
        )
        store.update_run(state="exhausted", end_reason="out of sessions")
    (root / "sessions" / "session-1").mkdir(parents=True)
    (root / "sessions" / "session-1" / "prompt.md").write_text("Session 1 of 3\n" + SUMMARY)
    with Journal(root / "journal.sqlite") as j:
        j.append(
            Observation(
                run=run_id,
                session="1",
                env="agent",
                kind="http_request",
                target="https://allowed.example/",
                decision="allow",
                rule="provider",
                reason="allowed host",
            )
        )
        j.append(
            Observation(
                run=run_id,
                session="1",
                env="agent",
                kind="http_request",
                target=JOURNAL_TARGET,
                decision="deny",
                rule=RULE,
                reason="not on the allow list",
            )
        )
    samples = [
        {
            "time": 1.0 + i,
            "mono": 1.0 + i,
            "host_available": 1 << 30,
            "pressure": {},
            "envs": {"agent": {"memory_bytes": (10 + i) << 20, "cpu_s": 0.1 * i}},
        }
        for i in range(3)
    ]
    (root / "footprint.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return root
