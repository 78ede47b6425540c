"""A child process for the store tests: appends events and acknowledges each on stdout.

    python writer.py sqlite|pg LOCATION RUN_ID TAG COUNT

An acknowledgement is printed only after the store call returned, i.e.
after its transaction committed: what the parent saw acknowledged must
survive a SIGKILL that arrives at any later instant.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    kind, where, run_id, tag, count = sys.argv[1:6]
    if kind == "sqlite":
        from corral.run.store import Store

        store = Store(Path(where))
    else:
        from corral.store.postgres import PgRunStore

        store = PgRunStore(where, run_id)  # type: ignore[assignment]
    for i in range(int(count)):
        store.event("tick", None, tag=tag, i=i, pad="x" * 2000)
        sys.stdout.write(f"{i}\n")
        sys.stdout.flush()
    store.close()


if __name__ == "__main__":
    main()
