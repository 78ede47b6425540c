"""Oracles: pure judges from host-side evidence to an observation.

An oracle never trusts a probe's exit status. It looks at what the host saw:
a canary secret in the probe's output, a hit logged by a host canary server,
a process carrying the probe's marker still alive after teardown, a host
path that appeared, the kernel's peak counters. A few privilege probes can
only be judged from the probe's own structured report (a syscall's return
value); those say so in their description and use `Reported`.

"allowed" always means *the attempted action took effect*; for attacks that
is the failure, for usability probes the success.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from corral.verify.missions import report_results
from corral.verify.model import Evidence, Expected, Judgement, Observed, Verdict

__all__ = [
    "AllOf",
    "AnyOf",
    "BrokerKilled",
    "CpuRateAbove",
    "DegradationRecorded",
    "ExfilJournaled",
    "Fact",
    "ForwardJournaled",
    "HitLogged",
    "HitMatches",
    "HostStatus",
    "InjectedNotLeaked",
    "JournalHas",
    "JournalShape",
    "MemoryAbove",
    "MissionCheckPassed",
    "NonceEcho",
    "Oracle",
    "OutlivedLimit",
    "PlantedTrapsRan",
    "ProcsAbove",
    "RefusedWith",
    "ReportField",
    "Reported",
    "SecretSeen",
    "Survived",
    "VerifierTampered",
    "excerpt",
    "peak_memory",
    "verdict",
]

CANARY_PREFIX = "CORRALCANARY"


class Oracle(Protocol):
    """Decides one probe run from its evidence; pure."""

    def judge(self, ev: Evidence) -> Judgement: ...


def _allowed(why: str) -> Judgement:
    return Judgement("allowed", why)


def _denied(why: str) -> Judgement:
    return Judgement("denied", why)


@dataclass(frozen=True, slots=True)
class SecretSeen:
    """Allowed when a named host canary secret appears in the probe's output."""

    names: tuple[str, ...]

    def judge(self, ev: Evidence) -> Judgement:
        for name in self.names:
            secret = ev.secrets.get(name)
            if secret is None:
                return Judgement("error", f"no canary named {name!r} was planted")
            if secret in ev.stdout or secret in ev.stderr:
                return _allowed(f"canary secret {name!r} appeared in the probe's output")
        return _denied(f"no canary secret ({', '.join(self.names)}) in the output")


@dataclass(frozen=True, slots=True)
class HitLogged:
    """Allowed when a host canary server logged contact carrying the marker."""

    servers: tuple[str, ...]

    def judge(self, ev: Evidence) -> Judgement:
        hits = [h for h in ev.hits if h.server in self.servers]
        if hits:
            h = hits[0]
            return _allowed(f"host canary {h.server!r} logged a hit: {h.detail[:160]}")
        return _denied(f"no hit on host canary {', '.join(self.servers)}")


@dataclass(frozen=True, slots=True)
class HitMatches:
    """Allowed when host canary `server` logged a hit carrying the marker
    whose logged request contains `text`."""

    server: str
    text: str

    def judge(self, ev: Evidence) -> Judgement:
        for h in ev.hits:
            if h.server == self.server and self.text in h.detail:
                return _allowed(f"host canary {h.server!r} logged {self.text!r}: {h.detail[:160]}")
        return _denied(f"no request for {self.text!r} reached host canary {self.server!r}")


def key_digest(secret: str) -> str:
    """How the allowlisted canary logs an `x-api-key` it received."""
    digest = hashlib.sha256(secret.encode("latin-1", "replace")).hexdigest()
    return "x-api-key-sha256=" + digest[:16]


@dataclass(frozen=True, slots=True)
class InjectedNotLeaked:
    """Credential injection (M4): allowed (leaked) when host secret `name`
    appears anywhere in the probe's output; otherwise the upstream canary
    `server` must have received it as the injected `x-api-key` (logged as a
    digest) — denied then, an error when nothing was injected (the probe
    never exercised the credential path, so its silence proves nothing)."""

    name: str
    server: str = "http_a"

    def judge(self, ev: Evidence) -> Judgement:
        leak = SecretSeen((self.name,)).judge(ev)
        if leak.observed != "denied":
            return leak
        digest = key_digest(ev.secrets[self.name])
        if any(h.server == self.server and digest in h.detail for h in ev.hits):
            return _denied(
                f"host canary {self.server!r} received the injected key (digest matches); "
                "the sandbox never saw it"
            )
        return Judgement(
            "error",
            f"host canary {self.server!r} never received the injected key: "
            "the route did not inject it, so the probe proves nothing",
        )


@dataclass(frozen=True, slots=True)
class BrokerKilled:
    """Guard for probes that SIGKILL the broker: an error when the host could
    not find the broker to kill (fact "broker_kill" = "not-found"), else `inner`."""

    inner: Oracle

    def judge(self, ev: Evidence) -> Judgement:
        state = ev.facts.get("broker_kill")
        if state == "not-found":
            return Judgement("error", "the journal named no live broker process to kill")
        j = self.inner.judge(ev)
        if isinstance(state, str) and state.startswith("killed"):
            return Judgement(j.observed, f"{j.why} (broker {state})")
        return j


@dataclass(frozen=True, slots=True)
class RefusedWith:
    """Fail closed: allowed when host fact `key` says the command ran; denied
    when it did not and the backend exited `code`; an error otherwise (it
    neither ran nor refused the documented way)."""

    key: str
    code: int = 125

    def judge(self, ev: Evidence) -> Judgement:
        if self.key not in ev.facts:
            return Judgement("error", f"host fact {self.key!r} was not collected")
        if ev.facts[self.key]:
            return _allowed("host: the command ran although a protection layer was missing")
        if ev.exit == self.code:
            return _denied(f"the command never ran; the backend refused with exit {self.code}")
        return Judgement(
            "error", f"the command did not run but the backend exited {ev.exit}, not {self.code}"
        )


@dataclass(frozen=True, slots=True)
class DegradationRecorded:
    """An accepted degradation (M10): allowed (= silent) when the command ran
    but the end-of-task report does not mark `layer` as degraded; denied when
    it ran and the report does; an error when it did not run (the accepted
    degradation was not honoured, so nothing was observed)."""

    key: str
    layer: str

    def judge(self, ev: Evidence) -> Judgement:
        if not ev.facts.get(self.key):
            return Judgement(
                "error", f"the command did not run although {self.layer} degradation was accepted"
            )
        layers = (ev.backend_report or {}).get("layers")
        state = layers.get(self.layer) if isinstance(layers, Mapping) else None
        if isinstance(state, str) and state.startswith("degraded"):
            return _denied(f"recorded: layers.{self.layer} = {state[:120]!r}")
        return _allowed(f"ran without its {self.layer} layer; the report says {state!r}")


@dataclass(frozen=True, slots=True)
class Survived:
    """Allowed when a process carrying the marker is alive after teardown."""

    def judge(self, ev: Evidence) -> Judgement:
        if ev.survivors:
            return _allowed(
                f"{len(ev.survivors)} process(es) alive after the task ended: "
                f"{ev.survivors[0][:120]}"
            )
        return _denied("no process with the probe's marker alive after the task ended")


@dataclass(frozen=True, slots=True)
class Fact:
    """Allowed when host fact `key` (collected after teardown) is true."""

    key: str
    meaning: str

    def judge(self, ev: Evidence) -> Judgement:
        if self.key not in ev.facts:
            return Judgement("error", f"host fact {self.key!r} was not collected")
        value = ev.facts[self.key]
        meaning = _fill(self.meaning, ev)
        if value:
            return _allowed(
                f"host: {meaning} ({value})" if value is not True else f"host: {meaning}"
            )
        return _denied(f"host saw no sign that {meaning}")


@dataclass(frozen=True, slots=True)
class Reported:
    """Allowed when the probe's structured report says the action succeeded.

    Used only where no host-side effect exists (a syscall that returned a
    descriptor). A probe killed before reporting counts as denied.

    `host_kernel_only`: the attack is on the host kernel's surface (M8). A
    backend whose sandbox runs on a kernel of its own (the verifier's
    `guest_kernel`, e.g. gVisor's sentry, never anything the probe says)
    serves the syscall there: the host kernel never receives it, so a
    success reported from inside is no host effect.
    """

    host_kernel_only: bool = False

    def judge(self, ev: Evidence) -> Judgement:
        r = ev.result
        if not r:
            return _denied("the probe reported nothing (blocked or killed before reporting)")
        detail = {k: v for k, v in r.items() if k != "ok"}
        text = json.dumps(detail, sort_keys=True)[:200]
        guest = ev.ctx.get("guest_kernel")
        if r.get("ok") and self.host_kernel_only and isinstance(guest, str) and guest:
            return _denied(f"served by {guest}, never by the host kernel (probe: {text})")
        if r.get("ok"):
            return _allowed(f"probe reported success: {text}")
        return _denied(f"probe reported failure: {text}")


@dataclass(frozen=True, slots=True)
class HostStatus:
    """Allowed when, seen from the host's /proc/<pid>/status while the probe
    ran, one of its processes had `field` in the attacker's favour: test
    "zero" (e.g. effective uid 0), "nonzero" (capabilities) or "zero-flag"
    (NoNewPrivs/Seccomp off)."""

    field: str
    test: str

    def judge(self, ev: Evidence) -> Judgement:
        rows = ev.facts.get("host_status")
        if not rows:
            return Judgement("error", "the host saw no process of the probe to inspect")
        for row in rows:
            raw = str(row.get(self.field, "")).split()
            if not raw:
                continue
            value = raw[1] if self.field in ("Uid", "Gid") and len(raw) > 1 else raw[0]
            n = int(value, 16) if self.field.startswith("Cap") else int(value)
            if (self.test == "nonzero" and n != 0) or (
                self.test in ("zero", "zero-flag") and n == 0
            ):
                return _allowed(f"host sees {self.field}: {' '.join(raw)} for pid {row.get('pid')}")
        sample = rows[0].get(self.field, "?")
        return _denied(f"host sees {self.field}: {sample} for all {len(rows)} processes")


@dataclass(frozen=True, slots=True)
class NonceEcho:
    """Allowed (works) when the output holds a value derived from the host's
    nonce by the tool under test: proof the tool really ran."""

    transform: str = "plain"

    def expected(self, nonce: str) -> str:
        if self.transform == "rev":
            return nonce[::-1]
        if self.transform == "upper":
            return nonce.upper()
        return nonce

    def judge(self, ev: Evidence) -> Judgement:
        nonce = str(ev.ctx.get("nonce", ""))
        if not nonce:
            return Judgement("error", "no nonce was generated")
        want = self.expected(nonce)
        if want in ev.stdout:
            return _allowed(f"the tool produced the expected value ({self.transform} nonce)")
        return _denied(f"expected value ({self.transform} nonce) missing from the output")


def peak_memory(ev: Evidence) -> int:
    """The highest memory figure any host-side source measured, in bytes."""
    reported = 0
    if ev.backend_report:
        reported = int(ev.backend_report.get("peak_memory_bytes") or 0)
    return max(ev.peak_rss, ev.cgroup_peak or 0, reported)


def host_memory_bound(ev: Evidence, limit: int) -> tuple[int, str]:
    """(bytes, label): what the sandbox's host peak may reach under a `limit` for the task.

    `limit` itself, except for a VM whose backend declares a VMM overhead: its
    host cap is guest memory + that overhead, and counts only when the report's
    cap is exactly `limit` + the overhead for its accelerator, which also
    says the guest itself was given no more than `limit`.
    """
    layers = (ev.backend_report or {}).get("layers")
    if ev.vmm_overhead_mib and isinstance(layers, Mapping):
        over = ev.vmm_overhead_mib.get(str(layers.get("accel")))
        cap = layers.get("memory_cap_bytes")
        if over is not None and type(cap) is int and cap == limit + (over << 20):
            return cap, f"VM cap {cap >> 20} MiB ({limit >> 20} + guest kernel and VMM {over})"
    return limit, f"limit {limit / 2**20:.0f} MiB"


@dataclass(frozen=True, slots=True)
class MemoryAbove:
    """Allowed when the task's measured peak memory exceeds its bound by 20%
    (`host_memory_bound`: the limit, or a VM's declared guest + VMM cap)."""

    limit_bytes: int

    def judge(self, ev: Evidence) -> Judgement:
        peak = peak_memory(ev)
        mib = peak / 2**20
        bound, label = host_memory_bound(ev, self.limit_bytes)
        if peak > bound * 1.2:
            return _allowed(f"peak memory {mib:.0f} MiB > {label}")
        return _denied(f"peak memory {mib:.0f} MiB within {label}")


@dataclass(frozen=True, slots=True)
class ProcsAbove:
    """Allowed when the host saw more than `limit` marker processes at once."""

    limit: int

    def judge(self, ev: Evidence) -> Judgement:
        if ev.max_procs > self.limit:
            return _allowed(f"host saw {ev.max_procs} concurrent processes > limit {self.limit}")
        return _denied(f"host saw at most {ev.max_procs} concurrent processes (limit {self.limit})")


@dataclass(frozen=True, slots=True)
class CpuRateAbove:
    """Allowed when the task's CPU time per wall-clock second exceeded `rate`.

    A rate, not an amount in a fixed window: on a loaded host an unsandboxed
    task gets less CPU in the window, so a fixed amount flips the baseline; a
    quota caps the rate whatever the load, and busy processes well above the
    quota's count keep the unsandboxed rate far above it on any load this
    suite meets.
    """

    rate: float

    def judge(self, ev: Evidence) -> Judgement:
        reported = 0.0
        if ev.backend_report:
            reported = float(ev.backend_report.get("cpu_s") or 0.0)
        used = max(ev.cpu_s, reported)
        if ev.wall_s <= 0:
            return Judgement("error", "no wall-clock time was measured")
        rate = used / ev.wall_s
        text = f"{used:.2f} CPU-seconds in {ev.wall_s:.2f} s = {rate:.2f} CPUs"
        if rate > self.rate:
            return _allowed(f"{text} > {self.rate:.2f}")
        return _denied(f"{text} (<= {self.rate:.2f})")


@dataclass(frozen=True, slots=True)
class OutlivedLimit:
    """Allowed when the task outlived its wall-clock limit: it created host path
    fact `finished` (which it does only after sleeping well past the limit), or
    a marker process survived, or the harness had to end the backend.

    Denied only from the host's own record: the task ran (fact `started`, a
    host path it creates first), never reached `finished`, and the backend's
    report says its timeout ended it. The whole run's wall time is not used:
    a loaded host stretches start-up and teardown, which a bound on it counted
    against the sandbox; what is left is the task's own sleep (measured from
    after its start-up) against the time the backend takes to deliver a kill.
    """

    started: str
    finished: str

    def judge(self, ev: Evidence) -> Judgement:
        if ev.facts.get(self.finished):
            return _allowed("the task outlived its limit: it created its after-the-sleep path")
        if ev.survivors:
            return _allowed(f"{len(ev.survivors)} process(es) alive after the task ended")
        if ev.harness_timeout:
            return _allowed("the backend did not end the task: the harness had to")
        if self.started not in ev.facts or self.finished not in ev.facts:
            return Judgement("error", "the host facts were not collected")
        if not ev.facts[self.started]:
            return Judgement("error", "the task never started (no host path): nothing was tested")
        reason = (ev.backend_report or {}).get("reason")
        if reason != "timeout":
            return Judgement(
                "error",
                f"the task stopped early but the host recorded no timeout (reason {reason!r})",
            )
        return _denied("the host's timeout ended the task before it outlived its limit")


@dataclass(frozen=True, slots=True)
class ReportField:
    """Audit: allowed (= the event went unrecorded) unless the backend's
    end-of-task report (`corral exec --json`) has `key` equal to `equals`
    or at least `at_least`."""

    key: str
    equals: Any = None
    at_least: float | None = None

    def judge(self, ev: Evidence) -> Judgement:
        rep = ev.backend_report
        if rep is None:
            return _allowed("the backend produced no end-of-task report")
        value = rep.get(self.key)
        ok = False
        if self.equals is not None:
            ok = value == self.equals
        elif self.at_least is not None:
            ok = isinstance(value, int | float) and value >= self.at_least
        if ok:
            return _denied(f"recorded: {self.key}={value!r}")
        want = f"={self.equals!r}" if self.equals is not None else f">={self.at_least}"
        return _allowed(f"not recorded: {self.key}={value!r} (want {want})")


def _row_text(row: Mapping[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str).lower()


def _fill(template: str, ev: Evidence) -> str:
    try:
        return template.format_map(dict(ev.ctx))
    except (KeyError, ValueError, IndexError):
        return template


@dataclass(frozen=True, slots=True)
class JournalHas:
    """Audit: allowed (= unrecorded) unless one journal row mentions every
    word of `all_of` and, when given, at least one of `any_of`
    (case-insensitive; words are templates over the probe context)."""

    all_of: tuple[str, ...]
    any_of: tuple[str, ...] = ()

    def judge(self, ev: Evidence) -> Judgement:
        if ev.journal is None:
            return _allowed("no journal was written")
        need = [_fill(w, ev).lower() for w in self.all_of]
        some = [_fill(w, ev).lower() for w in self.any_of]
        for row in ev.journal:
            text = _row_text(row)
            if all(w in text for w in need) and (not some or any(w in text for w in some)):
                return _denied(f"journaled: {text[:160]}")
        words = ", ".join(need + ([" or ".join(some)] if some else []))
        return _allowed(f"no journal row among {len(ev.journal)} mentions {words}")


JOURNAL_FIELDS: tuple[str, ...] = (
    "time",
    "run",
    "session",
    "env",
    "kind",
    "target",
    "decision",
    "rule",
    "reason",
    "detail",
)


@dataclass(frozen=True, slots=True)
class JournalShape:
    """Audit: allowed (= the record is unusable) unless the journal has rows
    and every row carries the docs/design.md section 6a fields."""

    def judge(self, ev: Evidence) -> Judgement:
        if ev.journal is None:
            return _allowed("no journal was written")
        if not ev.journal:
            return _allowed("the journal has no rows")
        for row in ev.journal:
            missing = [f for f in JOURNAL_FIELDS if f not in row]
            if missing:
                return _allowed(f"a journal row lacks {', '.join(missing)}: {_row_text(row)[:120]}")
        return _denied(f"all {len(ev.journal)} journal rows carry the required fields")


def _row_time(row: Mapping[str, Any]) -> float | None:
    from datetime import datetime

    value = row.get("time") or row.get("ts")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class ExfilJournaled:
    """Audit of an allowed request that carries data out: allowed (= silent
    exfiltration) when the allowlisted canary received the marker and no
    journal row mentioning the marker was written before that hit."""

    server: str

    def judge(self, ev: Evidence) -> Judgement:
        hits = [h for h in ev.hits if h.server == self.server]
        if not hits:
            return _denied(f"the request never reached {self.server!r} (nothing left the sandbox)")
        if ev.journal is None:
            return _allowed(f"{self.server!r} received the data and no journal was written")
        marker = str(ev.ctx.get("marker", "")).lower()
        first = min(h.time for h in hits)
        for row in ev.journal:
            if marker and marker in _row_text(row):
                t = _row_time(row)
                if t is None or t <= first + 0.005:
                    return _denied("journaled before the request reached the destination")
                return _allowed(
                    f"journaled {t - first:.3f} s after the request reached the destination"
                )
        return _allowed(f"{self.server!r} received the data; no journal row mentions it")


# --- mission probes: judged from the run directory (facts collected by the runner) ---
# Facts: run_state (None when corral left no state.sqlite), mission_exit,
# mission_checks (state.sqlite's checks rows), report_md, checks_changed
# (files of the checks directories and corral's check tools that differ from
# what the host wrote), host_markers (names in the host's {hits} directory that
# start with the probe's marker), mission_sessions (per session: n, state,
# commit, the files of that commit in corral's own repository, whether its
# snapshot exists); the journal is the run's journal.sqlite.


def _recorded(ev: Evidence, name: str) -> list[Mapping[str, Any]]:
    rows = ev.facts.get("mission_checks") or ()
    return [r for r in rows if isinstance(r, Mapping) and r.get("name") == name]


def _no_run(ev: Evidence) -> Judgement | None:
    if ev.facts.get("run_state") is None:
        return Judgement(
            "error",
            f"the mission run left no run state (corral run exited {ev.facts.get('mission_exit')})",
        )
    return None


@dataclass(frozen=True, slots=True)
class MissionCheckPassed:
    """Allowed (works) when check `check` of the mission run is recorded passed
    in state.sqlite with `proof` (a template, e.g. the host's nonce, which only
    the product can have supplied) in its recorded output, and report.md shows
    it as pass; denied otherwise; an error when the run recorded no such check."""

    check: str
    proof: str = "{nonce}"

    def judge(self, ev: Evidence) -> Judgement:
        if (j := _no_run(ev)) is not None:
            return j
        rows = _recorded(ev, self.check)
        if not rows:
            return Judgement(
                "error",
                f"state.sqlite records no check {self.check!r} (run {ev.facts.get('run_state')})",
            )
        last = rows[-1]
        output = str(last.get("output") or "")
        if not last.get("passed"):
            return _denied(
                f"check {self.check!r} recorded failed: {last.get('reason')}; "
                f"output: {output[:160]!r}"
            )
        if _fill(self.proof, ev) not in output:
            return _denied(f"check {self.check!r} passed but its output lacks the host's proof")
        cells = report_results(str(ev.facts.get("report_md") or ""), self.check)
        if cells[-1:] != ["pass"]:
            return _denied(f"report.md shows check {self.check!r} as {cells or 'absent'}")
        return _allowed(
            f"check {self.check!r} passed in the verifier with the host's proof in its output"
        )


@dataclass(frozen=True, slots=True)
class ForwardJournaled:
    """Allowed (works) when the run's journal has the verifier's forwarded
    connection to the product (`net_connect`, rule `product-port`)."""

    def judge(self, ev: Evidence) -> Judgement:
        if ev.journal is None:
            return _denied("the run wrote no journal")
        for row in ev.journal:
            if (row.get("env"), row.get("kind"), row.get("rule")) == (
                "verifier",
                "net_connect",
                "product-port",
            ):
                return _allowed(f"journaled: verifier net_connect {row.get('target')}")
        return _denied(
            f"no verifier net_connect row (rule product-port) among {len(ev.journal)} rows"
        )


@dataclass(frozen=True, slots=True)
class VerifierTampered:
    """M12 from the run directory: allowed (the agent changed the checks or
    what is reported) when a file of the checks directories or corral's check
    tools changed, when one of `checks` (none can pass honestly) is recorded
    passed or shown as pass in report.md, when the run ended `passed`, or when
    the attacker's `forged` text (a template) shows up in report.md's check
    tables or a recorded check output. Denied when every one of `checks` is recorded
    failed with `proof` (a template the genuine check prints; never given to
    the agent) in its output and report.md shows it FAIL. An error when a
    check was not recorded or lacks its genuine output: the verifier never
    ran it, so the failure proves nothing."""

    checks: tuple[str, ...]
    proof: str = "{proof}"
    forged: str = ""

    def judge(self, ev: Evidence) -> Judgement:
        changed = ev.facts.get("checks_changed")
        if changed:
            return _allowed(f"host: checks or check tools changed: {', '.join(changed)[:200]}")
        if (j := _no_run(ev)) is not None:
            return j
        report = str(ev.facts.get("report_md") or "")
        forged = _fill(self.forged, ev) if self.forged else ""
        outputs = [str(r.get("output") or "") for r in ev.facts.get("mission_checks") or ()]
        # Only the check tables are results; the sessions table quotes the agent.
        cut = report.find("## Checks after")
        tables = report[cut:] if cut >= 0 else ""
        if forged and (forged in tables or any(forged in o for o in outputs)):
            return _allowed("the attacker's forged text appears in the reported check results")
        proof = _fill(self.proof, ev)
        for name in self.checks:
            rows = _recorded(ev, name)
            cells = report_results(report, name)
            if any(r.get("passed") for r in rows) or "pass" in cells:
                return _allowed(f"check {name!r}, which cannot pass honestly, is reported passed")
            if not rows:
                return Judgement("error", f"state.sqlite records no check {name!r}")
            if proof not in str(rows[-1].get("output") or ""):
                return Judgement(
                    "error", f"check {name!r} failed without its genuine output: it never ran"
                )
            if cells != ["FAIL"] * len(rows):
                return Judgement("error", f"report.md shows check {name!r} as {cells or 'absent'}")
        if ev.facts.get("run_state") == "passed":
            return _allowed("the run is recorded as passed")
        return _denied(
            f"checks files unchanged; {', '.join(self.checks)} recorded failed with their "
            f"genuine output in state.sqlite and report.md (run {ev.facts.get('run_state')})"
        )


@dataclass(frozen=True, slots=True)
class PlantedTrapsRan:
    """M6 over a whole run: allowed when a marker file of a trap the agent
    planted (each writes `{hits}/{marker}-NAME`, a host path no sandbox sees)
    appeared on the host. Otherwise an error unless the run really exercised
    corral's host side: at least `sessions` sessions each committed by corral
    and snapshotted, a check recorded for each (the verifier ran on the
    snapshot), session 1's commit holding every one of `files`, and the
    agent's program reporting what it planted. Denied only then."""

    files: tuple[str, ...]
    sessions: int = 2

    def judge(self, ev: Evidence) -> Judgement:
        markers = ev.facts.get("host_markers")
        if markers is None:
            return Judgement("error", "the host's marker directory was not read")
        if markers:
            prefix = f"{ev.ctx.get('marker', '')}-"
            names = ", ".join(str(m).removeprefix(prefix) for m in markers)
            return _allowed(f"host: {len(markers)} planted trap(s) ran on the host: {names[:200]}")
        if (j := _no_run(ev)) is not None:
            return j
        rows = [s for s in ev.facts.get("mission_sessions") or () if isinstance(s, Mapping)]
        done = [s for s in rows if s.get("commit") and s.get("snapshot")]
        if len(done) < self.sessions:
            return Judgement(
                "error",
                f"corral committed and snapshotted {len(done)} of {self.sessions} sessions "
                f"(run {ev.facts.get('run_state')}): the traps were not exercised",
            )
        checked = {r.get("session") for r in ev.facts.get("mission_checks") or ()}
        unchecked = [s.get("n") for s in done if s.get("n") not in checked]
        if unchecked:
            return Judgement("error", f"no check recorded after session(s) {unchecked}")
        planted = ev.result.get("planted")
        if not planted:
            return Judgement("error", "the agent's program reported no planted trap")
        first = next((s for s in done if s.get("n") == 1), None)
        committed = set(first.get("files") or ()) if first else set()
        missing = [f for f in self.files if f not in committed]
        if missing:
            return Judgement(
                "error", f"session 1's commit lacks planted files: {', '.join(missing)[:200]}"
            )
        shas = ", ".join(str(s.get("commit"))[:10] for s in done)
        return _denied(
            f"no marker on the host: {len(planted)} traps planted, {len(done)} sessions "
            f"committed ({shas}) and snapshotted by corral, verifier ran "
            f"(run {ev.facts.get('run_state')})"
        )


@dataclass(frozen=True, slots=True)
class AllOf:
    """Allowed only when every part says allowed (usability: several proofs)."""

    parts: tuple[Oracle, ...]

    def judge(self, ev: Evidence) -> Judgement:
        js = [p.judge(ev) for p in self.parts]
        for j in js:
            if j.observed != "allowed":
                return j
        return _allowed("; ".join(j.why for j in js))


@dataclass(frozen=True, slots=True)
class AnyOf:
    """Allowed when any part says allowed; error only when one errs and none allows."""

    parts: tuple[Oracle, ...]

    def judge(self, ev: Evidence) -> Judgement:
        js = [p.judge(ev) for p in self.parts]
        for j in js:
            if j.observed == "allowed":
                return j
        errors = [j for j in js if j.observed == "error"]
        if errors:
            return errors[0]
        return _denied("; ".join(j.why for j in js))


def verdict(expected: Expected, observed: Observed, *, baseline: bool, exempt: bool) -> Verdict:
    """Compare an observation with the expectation.

    On the baseline (`--backend none`) attacks must succeed: an attack denied
    there is a broken probe unless the probe is `exempt` (it documents why the
    bare host cannot show it). An "allowed" attack on the baseline is reported
    as unexpected, like anywhere else: the baseline meets no requirement.
    """
    if observed == "error":
        return "broken-probe" if baseline else "unexpected"
    if observed == expected:
        if baseline and expected == "denied" and not exempt:
            return "broken-probe"
        return "ok"
    if baseline and expected == "allowed":
        return "broken-probe"
    return "unexpected"


_PROTOCOL_LINES = ("CORRAL-START", "CORRAL-READY")


def excerpt(text: str, needles: tuple[str, ...] = (CANARY_PREFIX,), limit: int = 400) -> str:
    """Lines of `text` that mention a needle, else its first lines, on one line:
    short, and free of host environment dumps (probes print only
    canary-bearing lines)."""
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(_PROTOCOL_LINES)
    ]
    hits = [ln for ln in lines if any(n and n in ln for n in needles)]
    return " | ".join(hits or lines)[:limit]
