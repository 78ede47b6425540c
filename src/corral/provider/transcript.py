"""What the provider was asked and what it answered: `ExchangeRecord` and its observers.

Every request produces one record, handed to each observer's
`on_exchange(record)` *before* the reply is sent (so a journal holds the
exchange even if the client vanishes mid-stream). If an observer raises, the
client gets an HTTP 500 instead of the reply: an exchange that cannot be
recorded is not served. `JsonlTranscript` appends one JSON object per line;
the broker journal plugs in through the same `ExchangeObserver` protocol.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from corral.errors import JournalError

__all__ = ["ExchangeObserver", "ExchangeRecord", "JsonlTranscript", "MemoryTranscript"]


@dataclass(frozen=True)
class ExchangeRecord:
    """One request and the reply it got.

    `turn` is the scenario position played (None for requests outside the
    script); `kind` is "reply", "prelude" (a deferred-tool search), "side"
    (a request offering no tools), "error" (the scenario could not go on, see
    `error`), "fault" (an injected HTTP error), "meta" (models, health) or
    "bad_request".
    """

    time: str
    method: str
    path: str
    endpoint: str
    family: str | None
    model: str | None
    stream: bool
    status: int
    kind: str
    turn: int | None = None
    script: str | None = None
    label: str | None = None
    attempt: int = 1
    tools: tuple[str, ...] = ()
    reply: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    fault: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True)


@runtime_checkable
class ExchangeObserver(Protocol):
    def on_exchange(self, record: ExchangeRecord) -> None:
        """Take note of `record`; raising makes the provider refuse the reply."""


class JsonlTranscript:
    """Appends each record as one JSON line to `path` (flushed per line)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise JournalError(
                f"cannot open transcript {self.path}: {exc.strerror or exc}"
            ) from exc

    def on_exchange(self, record: ExchangeRecord) -> None:
        line = record.to_json() + "\n"
        with self._lock:
            try:
                self._file.write(line)
                self._file.flush()
            except (OSError, ValueError) as exc:
                raise JournalError(f"cannot write transcript {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._file.close()


class MemoryTranscript:
    """Keeps records in a list (tests and in-process callers)."""

    def __init__(self) -> None:
        self.records: list[ExchangeRecord] = []
        self._lock = threading.Lock()

    def on_exchange(self, record: ExchangeRecord) -> None:
        with self._lock:
            self.records.append(record)
