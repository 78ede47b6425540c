"""Run `corral verify` against every backend, one after the other, and print the
Markdown comparison table the README carries.

    .venv/bin/python scripts/verify_compare.py [--backends namespace,none,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from corral.verify.model import MANDATORY as _MANDATORY
from corral.verify.model import USABILITY as _USABILITY

MANDATORY = tuple(_MANDATORY)
USABILITY = tuple(_USABILITY)


def run(backend: str, out: Path) -> dict[str, object]:
    report = out / f"verify-{backend}.json"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "corral", "verify", "--backend", backend, "--json", str(report)],
        capture_output=True,
        text=True,
        check=False,
    )
    if not report.exists():
        raise SystemExit(f"{backend}: no report (exit {proc.returncode}): {proc.stderr[-1000:]}")
    data: dict[str, object] = json.loads(report.read_text())
    data["_wall_s"] = round(time.monotonic() - t0)
    data["_exit"] = proc.returncode
    return data


def row(name: str, r: dict[str, object]) -> str:
    s = r["summary"]
    reqs = r["requirements"]
    assert isinstance(s, dict) and isinstance(reqs, dict)
    met = [k for k in MANDATORY if reqs.get(k) == "met"]
    failed = [k for k in MANDATORY if reqs.get(k) == "failed"]
    umet = [k for k in USABILITY if reqs.get(k) == "met"]
    return (
        f"| {name} | {s['observations']} | {s['allowed']} | {s['denied']} | {s['unexpected']} "
        f"| {len(met)}/{len(MANDATORY)} ({' '.join(met) or '-'}) | {' '.join(failed) or '-'} "
        f"| {len(umet)}/{len(USABILITY)} | {r['_wall_s']} s |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backends", default="namespace,bwrap-basic,srt,none")
    ap.add_argument("--out", default="/tmp/corral-verify-compare")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for backend in args.backends.split(","):
        print(f"running corral verify --backend {backend} ...", file=sys.stderr, flush=True)
        rows.append(row(backend, run(backend, out)))
    print(
        "| backend | observations | allowed | denied | unexpected | mandatory met "
        "| mandatory failed "
        "| usability met | wall |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for line in rows:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
