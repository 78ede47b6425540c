"""gVisor connect(): a reader that stalls gets the product's whole stream, late, not cut short.

`runsc exec` hands the in-sandbox forwarder its stdio non-blocking; a full
host end made its write raise EAGAIN and the forwarder exited, so a verifier
(or `corral view`) that read slower than the product wrote got a truncated
response. The attack: the product writes a stream of known length and the
host reads none of it until the product's own send buffer inside is full
(the forwarder stopped reading: blocked, or gone); then the host reads all
and counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.sandbox.backend import GVisorConfig, SandboxNet
from tests.conformance.helpers import PY, free_port, spec, until

pytestmark = [pytest.mark.requires_runsc, pytest.mark.requires_root, pytest.mark.requires_cgroup]

TOTAL = 32 << 20


def test_a_stalled_reader_gets_the_whole_stream(tmp_path: Path) -> None:
    port = free_port()
    # Sends TOTAL bytes; says "stalled" once its send buffer is full (nobody
    # reads: the forwarder is not taking its bytes), then sends the rest.
    serve = (
        "import socket, time\n"
        f"s = socket.create_server(('127.0.0.1', {port}))\n"
        "open('ready', 'w').write('1')\n"
        "c, _ = s.accept()\n"
        "c.setblocking(False)\n"
        f"left, chunk, said = {TOTAL}, bytes(1 << 16), False\n"
        "while left:\n"
        "    try:\n"
        "        left -= c.send(chunk[:left])\n"
        "    except BlockingIOError:\n"
        "        if not said:\n"
        "            open('stalled', 'w').write('1')\n"
        "            said = True\n"
        "        time.sleep(0.01)\n"
        "    except OSError:\n"
        "        open('cut', 'w').write('1')\n"
        "        break\n"
        "c.close()\n"
    )
    nets: list[SandboxNet] = []
    running = GVisorConfig().load().start(spec(tmp_path, PY, "-c", serve), network=nets.append)
    try:
        until((tmp_path / "ready").exists, "the server inside listens", 60)
        with nets[0].connect(port) as conn:
            until(
                lambda: (tmp_path / "stalled").exists() or (tmp_path / "cut").exists(),
                "the product's send buffer is full",
                60,
            )
            conn.settimeout(60)
            got = 0
            while data := conn.recv(1 << 16):
                got += len(data)
        assert got == TOTAL, f"{got} of {TOTAL} bytes arrived"
        assert not (tmp_path / "cut").exists()
    finally:
        running.close()
