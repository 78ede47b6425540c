"""A child for the journal durability test: appends observations, acknowledging each.

    python journal_writer.py PATH URL|- SOURCE RUN COUNT

With a URL the journal is the fleet's `TeeJournal` (SQLite + PostgreSQL), with
`-` the plain SQLite `Journal`. An acknowledgement is printed only after the
commit returned, i.e. when the action it allows could go ahead.
"""

from __future__ import annotations

import sys

from corral.broker.actions import Identity, NetConnect, Observation
from corral.broker.pgjournal import ENV_SOURCE, ENV_STORE, open_journal


def main() -> None:
    path, url, source, run, count = sys.argv[1:6]
    env = {} if url == "-" else {ENV_STORE: url, ENV_SOURCE: source}
    journal = open_journal(path, environ=env)
    who = Identity(run=run, session="1", env="agent")
    for i in range(int(count)):
        obs = Observation.of(
            NetConnect(host=f"h{i}.example", port=443), who, decision="allow", rule="r", reason="t"
        )
        rowid = journal.append(obs)
        journal.record_outcome(rowid, i, i, {})
        sys.stdout.write(f"{i}\n")
        sys.stdout.flush()
    journal.close()


if __name__ == "__main__":
    main()
