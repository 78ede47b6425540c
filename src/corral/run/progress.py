"""Progress of a run: a live rich panel on a terminal, plain lines otherwise.

The coordinator calls `update(**fields)` (any subset of `FIELDS`) and `line(text)`
for lasting messages. `render_status(state)` is pure (unit-tested). Fields and
lines may quote the agent (an end reason holds its error text): both displays
show them through `corral.display`, escaped and bounded, never as rich markup.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any, Protocol

from corral import display

__all__ = [
    "FIELDS",
    "LiveProgress",
    "NullProgress",
    "PlainProgress",
    "Progress",
    "make_progress",
    "render_status",
]

FIELDS: tuple[str, ...] = (
    "run",
    "session",
    "max_sessions",
    "phase",
    "activity",
    "allowed",
    "denied",
    "checks_passed",
    "checks_total",
    "run_peak",
    "memory_cap",
    "state",
)


class Progress(Protocol):
    def update(self, **fields: Any) -> None: ...

    def line(self, text: str) -> None: ...

    def close(self) -> None: ...


#: Characters of one progress line (it may quote an agent's error text).
_LINE_LIMIT = 500


def _mib(n: object) -> str:
    return f"{int(n) / (1 << 20):.0f} MiB" if isinstance(n, int) else "-"


def render_status(state: dict[str, Any], elapsed_s: float) -> str:
    """One line summarising the run (pure)."""
    parts = [
        f"{state.get('run', '?')}",
        f"session {state.get('session', 0)}/{state.get('max_sessions', '?')}",
        f"{int(elapsed_s // 60)}:{int(elapsed_s % 60):02d}",
        f"{state.get('phase', '-')}: {state.get('activity', '')}",
        f"observations {state.get('allowed', 0)} allowed / {state.get('denied', 0)} denied",
    ]
    if state.get("checks_total"):
        parts.append(f"checks {state.get('checks_passed', 0)}/{state['checks_total']}")
    if state.get("run_peak") is not None:
        parts.append(
            f"memory peak {_mib(state.get('run_peak'))} of {_mib(state.get('memory_cap'))}"
        )
    if state.get("state"):
        parts.append(f"state {state['state']}")
    return " | ".join(parts)


class NullProgress:
    def update(self, **fields: Any) -> None:
        pass

    def line(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class PlainProgress:
    """Plain lines: one per phase change and per `line()` (for logs and pipes)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stdout
        self._state: dict[str, Any] = {}
        self._started = time.monotonic()

    def update(self, **fields: Any) -> None:
        before = (self._state.get("session"), self._state.get("phase"), self._state.get("state"))
        self._state.update(fields)
        after = (self._state.get("session"), self._state.get("phase"), self._state.get("state"))
        if after != before and (self._state.get("phase") or self._state.get("state")):
            self._emit(render_status(self._state, time.monotonic() - self._started))

    def line(self, text: str) -> None:
        self._emit(text)

    def _emit(self, text: str) -> None:
        self._stream.write(f"corral: {display.show(text, _LINE_LIMIT)}\n")
        self._stream.flush()

    def close(self) -> None:
        pass


class LiveProgress:
    """A rich Live panel refreshed a few times a second."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console()
        self._state: dict[str, Any] = {}
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._live = Live(
            self._render(), console=self._console, refresh_per_second=4, get_renderable=self._render
        )
        self._live.start()

    def _render(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            st = dict(self._state)
        elapsed = time.monotonic() - self._started
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("run", display.text(st.get("run", "?")))
        table.add_row(
            "session", display.text(f"{st.get('session', 0)}/{st.get('max_sessions', '?')}")
        )
        table.add_row("elapsed", f"{int(elapsed // 60)}:{int(elapsed % 60):02d}")
        table.add_row("activity", display.text(f"{st.get('phase', '-')}: {st.get('activity', '')}"))
        table.add_row(
            "observations",
            Text.assemble(
                display.text(f"{st.get('allowed', 0)} allowed", style="green"),
                " / ",
                display.text(f"{st.get('denied', 0)} denied", style="red"),
            ),
        )
        if st.get("checks_total"):
            table.add_row(
                "checks", display.text(f"{st.get('checks_passed', 0)}/{st['checks_total']} passing")
            )
        if st.get("run_peak") is not None:
            table.add_row(
                "memory", f"peak {_mib(st.get('run_peak'))} of {_mib(st.get('memory_cap'))}"
            )
        if st.get("state"):
            table.add_row("state", display.text(st["state"]))
        return table

    def update(self, **fields: Any) -> None:
        with self._lock:
            self._state.update(fields)

    def line(self, text: str) -> None:
        self._live.console.print(display.text(text, limit=_LINE_LIMIT))

    def close(self) -> None:
        self._live.stop()


def make_progress(stream: IO[str] | None = None) -> Progress:
    """Live display on a terminal, plain lines otherwise."""
    out = stream or sys.stdout
    if out.isatty():
        return LiveProgress()
    return PlainProgress(out)
