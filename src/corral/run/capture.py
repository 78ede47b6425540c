"""A sandbox's stdout or stderr, drained from a pipe into a host-only file, bounded.

The agent sandbox's output reaches the host through a pipe corral owns (the
sandbox's stdio), never through a file under one of its writable mounts: what
the host parses afterwards (the CLI's result line) is then what the agent
printed, not a file it could rewrite or replace after the fact.

A sandbox can print gigabytes. The file keeps the first `head` bytes as they
arrive, then a one-line marker saying how much was dropped, then the last
`tail` bytes (a CLI's result is its last line); the pipe is drained to its
end either way so the writer never blocks. `HeadTail` is the pure part.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Capture", "HeadTail", "dropped_marker"]

_CHUNK = 65536


def dropped_marker(dropped: int, total: int) -> bytes:
    """The line standing for the bytes a capture dropped (never a JSON line)."""
    return f"\n[corral: {dropped} bytes of output dropped here; {total} bytes in all]\n".encode()


@dataclass(slots=True)
class HeadTail:
    """Keeps the first `head` bytes (handed out as they come) and the last `tail` (pure)."""

    head: int
    tail: int
    total: int = 0
    _kept_head: int = 0
    _tail: bytearray | None = None

    def feed(self, data: bytes) -> bytes:
        """Bytes to write now (the part of `data` within the head)."""
        self.total += len(data)
        room = self.head - self._kept_head
        now = data[: max(room, 0)]
        self._kept_head += len(now)
        rest = data[len(now) :]
        if rest:
            buf = self._tail if self._tail is not None else bytearray()
            buf += rest
            if len(buf) > 2 * self.tail:
                del buf[: len(buf) - self.tail]
            self._tail = buf
        return now

    def end(self) -> bytes:
        """Bytes to write at the end: the marker and the tail, if anything was held back."""
        if self._tail is None:
            return b""
        tail = bytes(self._tail[-self.tail :]) if self.tail else b""
        dropped = self.total - self._kept_head - len(tail)
        return (dropped_marker(dropped, self.total) if dropped else b"") + tail


class Capture:
    """A pipe for one stdio stream of a sandbox, drained into `path` by a thread.

    `writer` is the pipe's write end for the sandbox; `close_writer()` once
    the sandbox has started (the sandbox holds its own copy); `finish()`
    after the sandbox was torn down, which waits for the end of the stream.
    """

    def __init__(self, path: Path, *, head: int, tail: int) -> None:
        self.path = path
        self._acc = HeadTail(head, tail)
        self._stop = threading.Event()
        self._fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        try:
            self._r, self.writer = os.pipe2(os.O_CLOEXEC)
        except OSError:
            os.close(self._fd)
            raise
        os.set_blocking(self._r, False)
        self._writer_open = True
        self._finished = False
        self._thread = threading.Thread(target=self._drain, name=f"capture {path.name}")
        self._thread.daemon = True
        self._thread.start()

    @property
    def total(self) -> int:
        return self._acc.total

    def close_writer(self) -> None:
        if self._writer_open:
            self._writer_open = False
            os.close(self.writer)

    def _drain(self) -> None:
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([self._r], [], [], 0.2)
                if not ready:
                    continue
                try:
                    data = os.read(self._r, _CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    return
                self._write(self._acc.feed(data))
        except OSError:
            return

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def finish(self, timeout_s: float = 5.0) -> None:
        """Wait for the end of the stream (at most `timeout_s` more), write the tail, close.

        Idempotent: the descriptors are closed once.
        """
        if self._finished:
            return
        self._finished = True
        self.close_writer()
        self._thread.join(timeout_s)
        # A descendant that escaped the teardown would keep the pipe open
        # forever; the capture ends anyway (and drops what comes later).
        self._stop.set()
        self._thread.join()
        try:
            with contextlib.suppress(OSError):
                self._write(self._acc.end())
        finally:
            os.close(self._fd)
            os.close(self._r)
