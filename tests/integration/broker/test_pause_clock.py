"""The broker's timers stop counting while the run is paused (issue 10).

A session broker of `corral run` is in the run cgroup, frozen with the
sandbox it serves. Here a real broker process and a stand-in sandbox client
(a process holding a keep-alive connection to it) are put into a run
cgroup, which is frozen for longer than the broker's upstream and idle
timeouts. With the run's pauses file in its config (`pauses`, as the
coordinator sets it) the request in flight across the pause gets its
response after the thaw and the idle connection is still usable; the
control is the same pause without the pauses file (today's clock): the
request fails and the connection is closed on the thaw. Without a pause
the same timeouts still fire.

Judged from the host: what the client received, the upstream's hits, the
broker's journal. Each freeze starts only once the broker's loop is back
in epoll (its wchan), i.e. with the timer under test armed; the idle test's
second request is written to the client while it is frozen.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.broker.config import BrokerConfig, LimitsConfig, RuleConfig
from corral.broker.journal import read_rows
from corral.broker.process import BrokerProcess, start_broker
from corral.errors import CorralError
from corral.run.environments import RunLayout
from corral.run.pause import publish_pauses
from corral.run.runcg import RunCgroup

from .testlib import Hit, RecordingServer, Reply

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup, pytest.mark.timeout(60)]

# The broker's own active time in a request is milliseconds; the freeze
# alone is longer than either timeout, so only a clock that stops across
# it lets the request through.
_TIMEOUT_S = 2.0
_PAUSE_S = 3.5

# The stand-in sandbox: one keep-alive connection to the broker; each
# stdin line is a URL to GET through it; each answer is one JSON line.
_CLIENT = r"""
import json, socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
buf = b""
def recv():
    global buf
    data = sock.recv(65536)
    if not data:
        raise EOFError
    buf += data
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    url = line.strip()
    host = url.split("/")[2]
    try:
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        while b"\r\n\r\n" not in buf:
            recv()
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = 0
        for h in lines[1:]:
            k, _, v = h.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v)
        while len(buf) < length:
            recv()
        body, buf = buf[:length], buf[length:]
        out = {"status": int(lines[0].split()[1]), "body": body.decode("utf-8", "replace")}
    except (EOFError, OSError) as exc:
        out = {"closed": repr(exc)}
    print(json.dumps(out), flush=True)
"""


# A client that connects and says nothing: what it sees, within 30 s.
_SILENT = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
print("closed by the broker" if s.recv(1) == b"" else "data")
"""


def _wait_until_waiting(pid: int, timeout: float = 10.0) -> None:
    """Until the broker's event loop blocks in epoll (its wchan, read on the host).

    Seen after the upstream got the request (or the client its answer),
    this means the broker has armed the timer it now waits under: a freeze
    from here on lands inside that timeout, on a loaded host too.
    """
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/task/{pid}/wchan").read_text() != "do_epoll_wait":
        assert time.monotonic() < deadline, "the broker's loop never went back to waiting"
        time.sleep(0.002)


@pytest.fixture
def run_cg() -> Iterator[RunCgroup]:
    cg = RunCgroup.detect(f"t{secrets.token_hex(4)}")
    assert cg is not None
    cg.create(512 << 20)
    try:
        yield cg
    finally:
        with contextlib.suppress(CorralError, OSError):
            cg.thaw()
        with contextlib.suppress(CorralError, OSError):
            cg.sweep()


class _Upstream:
    """`/slow` answers once released, `/fast` at once, `/hang` never (until closed)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closing = threading.Event()

        def slow(hit: Hit) -> Reply:
            self.release.wait(30)
            return 200, [("Content-Type", "text/plain")], b"slow answer\n"

        def hang(hit: Hit) -> Reply:
            self.closing.wait(30)
            return 200, [], b"too late\n"

        self.server = RecordingServer({"/slow": slow, "/hang": hang})
        self.port = self.server.port
        self.url = f"http://up.test:{self.port}"

    def wait_hit(self, path: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.server.hits_for(path):
            assert time.monotonic() < deadline, f"the upstream never saw {path}"
            time.sleep(0.002)

    def close(self) -> None:
        self.release.set()
        self.closing.set()
        self.server.close()


@pytest.fixture
def upstream() -> Iterator[_Upstream]:
    up = _Upstream()
    try:
        yield up
    finally:
        up.close()


@dataclass
class _Run:
    """A broker and a client in `cg`, and the run's pauses file."""

    cg: RunCgroup
    broker: BrokerProcess
    client: subprocess.Popen[str]
    layout: RunLayout

    def get(self, url: str) -> None:
        assert self.client.stdin is not None
        self.client.stdin.write(url + "\n")
        self.client.stdin.flush()

    def answer(self) -> dict[str, object]:
        assert self.client.stdout is not None
        line = self.client.stdout.readline()
        assert line, "the client died"
        doc: dict[str, object] = json.loads(line)
        return doc

    def publish(self, intervals: list[tuple[float, float | None]]) -> None:
        """What `corral pause` and `resume` do to the run's pauses file."""
        publish_pauses(self.layout, lambda: intervals)


@pytest.fixture
def started(run_cg: RunCgroup) -> Iterator[list[_Run]]:
    runs: list[_Run] = []
    yield runs
    for run in runs:
        with contextlib.suppress(CorralError, OSError):
            run_cg.thaw()
        run.client.kill()
        run.client.communicate(timeout=10)  # reaps it and closes its pipes
        run.broker.stop()


def _start(
    tmp_path: Path, cg: RunCgroup, started: list[_Run], upstream: _Upstream, pause_aware: bool
) -> _Run:
    layout = RunLayout(tmp_path / "run")
    layout.tools.mkdir(parents=True, exist_ok=True)
    config = BrokerConfig.model_validate(
        {
            "rules": [RuleConfig(host="up.test", ports=(upstream.port,), allow_private=True)],
            "resolver_overrides": {"up.test": "127.0.0.1"},
            "system_dns": False,
            "limits": LimitsConfig(
                idle_timeout_s=_TIMEOUT_S,
                upstream_timeout_s=_TIMEOUT_S,
                header_timeout_s=_TIMEOUT_S,
            ),
            "pauses": str(layout.pauses) if pause_aware else None,
        }
    )
    broker = start_broker(
        config,
        layout.journal,
        run="r1",
        session="1",
        env="agent",
        listen=("127.0.0.1:0",),
    )
    port = broker.wait_ready(20.0).tcp_ports[0]
    cg.attach_helper(broker.pid)
    client = subprocess.Popen(
        [sys.executable, "-I", "-c", _CLIENT, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    cg.attach_helper(client.pid)
    run = _Run(cg, broker, client, layout)
    started.append(run)
    assert run.answer() == {"ready": True}
    assert cg.pids() >= {broker.pid, client.pid}
    return run


def _request_across_pause(
    tmp_path: Path,
    run_cg: RunCgroup,
    started: list[_Run],
    upstream: _Upstream,
    pause_aware: bool,
) -> tuple[dict[str, object], float]:
    run = _start(tmp_path, run_cg, started, upstream, pause_aware)
    run.get(f"{upstream.url}/slow")
    upstream.wait_hit("/slow")
    _wait_until_waiting(run.broker.pid)
    # In flight: the upstream holds the request. It answers while the
    # broker is frozen; the answer waits in the broker's socket.
    start = time.monotonic()
    run.publish([(start, None)])
    run_cg.freeze()
    upstream.release.set()
    time.sleep(_PAUSE_S)
    frozen_for = time.monotonic() - start
    run_cg.thaw()
    run.publish([(start, time.monotonic())])
    return run.answer(), frozen_for


def test_a_request_in_flight_across_a_pause_longer_than_the_upstream_timeout_completes(
    tmp_path: Path,
    run_cg: RunCgroup,
    started: list[_Run],
    upstream: _Upstream,
) -> None:
    answer, frozen_for = _request_across_pause(tmp_path, run_cg, started, upstream, True)
    assert frozen_for > _TIMEOUT_S
    assert answer == {"status": 200, "body": "slow answer\n"}
    assert len(upstream.server.hits_for("/slow")) == 1
    # The pausable loop stops as asyncio's own does: SIGTERM, journal flushed.
    run = started[0]
    assert run.broker.stop() == 0
    starts = read_rows(run.layout.journal, kind="process_event")
    assert [r.detail.get("pauses") for r in starts if r.target.startswith("broker_start")] == [
        str(run.layout.pauses)
    ]
    assert any(r.target.startswith("broker_stop") for r in starts)


def test_control_without_the_pauses_the_request_fails_on_the_thaw(
    tmp_path: Path,
    run_cg: RunCgroup,
    started: list[_Run],
    upstream: _Upstream,
) -> None:
    answer, frozen_for = _request_across_pause(tmp_path, run_cg, started, upstream, False)
    assert frozen_for > _TIMEOUT_S
    # The upstream timer fired on the thaw, though the answer was there.
    assert answer.get("status") == 502, answer
    assert "upstream failed: TimeoutError" in str(answer.get("body")), answer


def _idle_across_pause(
    tmp_path: Path,
    run_cg: RunCgroup,
    started: list[_Run],
    upstream: _Upstream,
    pause_aware: bool,
) -> tuple[dict[str, object], dict[str, object]]:
    run = _start(tmp_path, run_cg, started, upstream, pause_aware)
    run.get(f"{upstream.url}/fast")
    first = run.answer()
    assert first.get("status") == 200, first
    _wait_until_waiting(run.broker.pid)
    start = time.monotonic()
    run.publish([(start, None)])
    run_cg.freeze()
    # Written to the frozen client: it sends on the kept connection at the thaw.
    run.get(f"{upstream.url}/fast")
    time.sleep(_PAUSE_S)
    run_cg.thaw()
    run.publish([(start, time.monotonic())])
    return first, run.answer()


def test_an_idle_keepalive_connection_survives_a_pause_longer_than_the_idle_timeout(
    tmp_path: Path,
    run_cg: RunCgroup,
    started: list[_Run],
    upstream: _Upstream,
) -> None:
    _, second = _idle_across_pause(tmp_path, run_cg, started, upstream, True)
    assert second.get("status") == 200, second
    # On the same connection (the client never reconnects), sent at the thaw.
    assert len(upstream.server.hits_for("/fast")) == 2


def test_control_without_the_pauses_the_idle_connection_is_closed_on_the_thaw(
    tmp_path: Path,
    run_cg: RunCgroup,
    started: list[_Run],
    upstream: _Upstream,
) -> None:
    _, second = _idle_across_pause(tmp_path, run_cg, started, upstream, False)
    assert "closed" in second, second
    assert len(upstream.server.hits_for("/fast")) == 1


def test_unpaused_the_upstream_and_idle_timeouts_still_fire(
    tmp_path: Path,
    run_cg: RunCgroup,
    started: list[_Run],
    upstream: _Upstream,
) -> None:
    run = _start(tmp_path, run_cg, started, upstream, True)
    # A pause long before: it is subtracted, the clock runs on after it.
    now = time.monotonic()
    run.publish([(now - 100.0, now - 50.0)])
    run.get(f"{upstream.url}/hang")
    answer = run.answer()
    assert answer.get("status") == 502, answer
    assert "upstream failed: TimeoutError" in str(answer.get("body")), answer
    assert upstream.server.hits_for("/hang")
    # The idle timer: a connection that sends nothing is closed by the broker.
    assert run.broker.ready is not None
    idle = subprocess.run(
        [sys.executable, "-I", "-c", _SILENT, str(run.broker.ready.tcp_ports[0])],
        capture_output=True,
        text=True,
        timeout=40,
        check=False,
    )
    assert idle.stdout.strip() == "closed by the broker", idle
