"""A JSON bomb posted to the synthetic provider costs the host a bounded amount.

The provider runs as its own process (as `corral provider serve`), so its peak
resident memory is read host-side from /proc (VmHWM) rather than guessed.
"""

from __future__ import annotations

import http.client
import json
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"
CORRAL = Path(sys.executable).parent / "corral"
#: 24 MiB of `{},`: about 750 MiB of dicts once parsed without bounds.
BOMB = b'{"model":"m","max_tokens":8,"messages":[' + b"{}," * (8 << 20) + b"{}]}"
PEAK_LIMIT = 160 << 20


def _hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    transcript = tmp_path / "t.jsonl"
    argv = [str(CORRAL), "provider", "serve", "--scenario", str(SCENARIOS / "write-file.yaml")]
    with subprocess.Popen(
        [*argv, "--transcript", str(transcript)], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 20)
            line = proc.stdout.readline() if ready else ""
            assert "listening on http://127.0.0.1:" in line, line
            yield proc, int(line.rsplit(":", 1)[1]), transcript
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _post(port: int, body: bytes, chunked: bool) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        path = "/routes/anthropic/v1/messages"
        headers = {"content-type": "application/json"}
        if chunked:
            chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))
            conn.request("POST", path, body=chunks, headers=headers, encode_chunked=True)
        else:
            conn.request("POST", path, body=body, headers=headers)
        try:
            return conn.getresponse().status
        except (ConnectionResetError, BrokenPipeError):
            return -1
    except (ConnectionResetError, BrokenPipeError):
        # Refused while still sending: the answer may be lost to the reset.
        return -1
    finally:
        conn.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_json_bomb_is_refused_with_413_and_bounded_memory(
    provider: tuple[subprocess.Popen[str], int, Path], chunked: bool
) -> None:
    proc, port, transcript = provider
    base = _hwm(proc.pid)
    status = _post(port, BOMB, chunked)
    peak = _hwm(proc.pid)
    assert peak - base < PEAK_LIMIT, f"provider grew by {(peak - base) >> 20} MiB"
    assert status in (413, -1)
    rows = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [(r["status"], r["kind"]) for r in rows] == [(413, "bad_request")]
    assert "over the" in rows[0]["error"]
    # Still serving, and an ordinary request still works.
    ok = _post(port, json.dumps({"model": "m", "max_tokens": 8, "messages": []}).encode(), False)
    assert ok != 413
