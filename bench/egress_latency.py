"""Egress start-up: a cold broker per sandbox vs the resident broker, in one run.

Two measurements, rounds interleaved so that machine load hits every side alike:

1. broker only (no sandbox): from "here is a listening socket" to the first
   byte of a GET relayed through the broker to a loopback upstream. Cold is
   `start_broker` + `wait_ready` (a fresh interpreter); resident is
   `attach_resident` to an already running resident broker. Target: <= 40 ms.
2. `corral exec --allow ... -- curl` end to end (a real namespace sandbox,
   curl inside fetching through the broker), with `CORRAL_BROKER=cold` and
   with the resident, next to `corral exec -- true` without egress.

Wall time depends on the host's load (printed); CPU time (the launcher's
children plus the resident's own /proc counters) does not, so both are shown.

    .venv/bin/python bench/egress_latency.py [--rounds 9] [--exec-rounds 5]
"""

from __future__ import annotations

import argparse
import http.server
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from corral.broker.config import BrokerConfig, RuleConfig
from corral.broker.process import start_broker
from corral.broker.resident import attach_resident

_TICK = os.sysconf("SC_CLK_TCK")
_SRC = str(Path(__file__).resolve().parent.parent / "src").encode()


class _Quiet(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, format: str, *args: object) -> None:
        return


def _upstream() -> int:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return int(server.server_address[1])


def _config(port: int) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "rules": [RuleConfig(host="up.test", ports=(port,), allow_private=True)],
            "resolver_overrides": {"up.test": "127.0.0.1"},
            "system_dns": False,
        }
    )


def _first_byte(proxy_port: int, up: int) -> None:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=30) as s:
        s.sendall(f"GET http://up.test:{up}/ HTTP/1.1\r\nHost: up.test\r\n\r\n".encode())
        if not s.recv(1):
            raise SystemExit("no reply through the broker")


def _listener() -> tuple[socket.socket, int]:
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    return lsock, int(lsock.getsockname()[1])


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _cold(config: BrokerConfig, journal: Path, up: int) -> tuple[float, float]:
    lsock, port = _listener()
    c0 = _children_cpu()
    t0 = time.perf_counter()
    proc = start_broker(config, journal, listen_fds=[lsock.fileno()], die_with_parent=False)
    lsock.close()
    proc.wait_ready(60)
    _first_byte(port, up)
    wall = time.perf_counter() - t0
    proc.stop()
    return wall, _children_cpu() - c0


def _resident(
    config_json: str, journal: Path, up: int, sock: Path, known: int | None = None
) -> tuple[float, float, int]:
    lsock, port = _listener()
    c0 = _cpu_of(known) if known is not None else 0.0
    t0 = time.perf_counter()
    att = attach_resident(
        lsock, config_json, journal, run="b", session=None, env="exec", socket_path=sock
    )
    lsock.close()
    _first_byte(port, up)
    wall = time.perf_counter() - t0
    att.detach()
    return wall, _cpu_of(att.pid) - c0, att.pid


def _exec(
    mode: str, allow: bool, *, cfg: Path, ws: Path, up: int, pid: list[int]
) -> tuple[float, float]:
    argv = [sys.executable, "-m", "corral", "exec", "--workspace", str(ws)]
    if allow:
        argv += [
            "--config",
            str(cfg),
            "--",
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            f"http://up.test:{up}/",
        ]
    else:
        argv += ["--", "true"]
    env = {**os.environ, "CORRAL_BROKER": mode}
    c0 = _children_cpu()
    r0 = _cpu_of(pid[0]) if pid else 0.0
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    extra = 0.0
    if mode == "resident" and allow:
        found = _find_resident()
        if pid and found == pid[0]:
            extra = _cpu_of(pid[0]) - r0
        elif found is not None:
            pid[:] = [found]
    return wall, _children_cpu() - c0 + extra


def _find_resident() -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"resident" in cmd and _SRC in cmd and b"/tmp/corral-bench-" not in b" ".join(cmd):
                return int(entry.name)
    return None


def _fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1000:7.1f} ms (min {min(xs) * 1000:6.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--exec-rounds", type=int, default=5)
    args = parser.parse_args()
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus, {when}")
    up = _upstream()
    config = _config(up)
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o700)
        sock = root / "rb" / "resident.sock"
        # The resident's first attach starts it (what the first sandbox of a run pays).
        first, _, rpid = _resident(config.to_json(), root / "r0.sqlite", up, sock)
        cold_w: list[float] = []
        cold_c: list[float] = []
        res_w: list[float] = []
        res_c: list[float] = []
        for i in range(args.rounds):
            w, c = _cold(config, root / f"c{i}.sqlite", up)
            cold_w.append(w)
            cold_c.append(c)
            w, c, _ = _resident(config.to_json(), root / f"r{i + 1}.sqlite", up, sock, rpid)
            res_w.append(w)
            res_c.append(c)
        print("1. listener -> first byte through the broker (no sandbox)")
        print(f"   cold broker      wall {_fmt(cold_w)}   cpu {_fmt(cold_c)}")
        print(f"   resident (warm)  wall {_fmt(res_w)}   cpu {_fmt(res_c)}")
        print(f"   resident's first attach (spawns it): {first * 1000:.1f} ms")
        ratio = statistics.median(cold_w) / statistics.median(res_w)
        print(f"   ratio cold/resident (median wall): {ratio:.1f}x")
        os.kill(rpid, 15)

        cfg = root / "corral.toml"
        cfg.write_text(
            'resolver_overrides = { "up.test" = "127.0.0.1" }\nsystem_dns = false\n'
            f'[[rules]]\nhost = "up.test"\nports = [{up}]\nallow_private = true\n'
        )
        ws = root / "ws"
        ws.mkdir()
        results: dict[str, tuple[list[float], list[float]]] = {
            k: ([], []) for k in ("none", "cold", "resident")
        }
        pid: list[int] = []
        # Warm the resident (and the page cache).
        _exec("resident", True, cfg=cfg, ws=ws, up=up, pid=pid)
        for _ in range(args.exec_rounds):
            for name, mode, allow in (
                ("none", "cold", False),
                ("cold", "cold", True),
                ("resident", "resident", True),
            ):
                w, c = _exec(mode, allow, cfg=cfg, ws=ws, up=up, pid=pid)
                results[name][0].append(w)
                results[name][1].append(c)
        print("2. corral exec end to end (curl through the broker inside a namespace sandbox)")
        for name, (walls, cpus) in results.items():
            label = {
                "none": "no egress (true)",
                "cold": "--config, cold",
                "resident": "--config, resident",
            }[name]
            print(f"   {label:20} wall {_fmt(walls)}   cpu {_fmt(cpus)}")
        base_w = statistics.median(results["none"][0])
        base_c = statistics.median(results["none"][1])
        for name in ("cold", "resident"):
            w_ms = (statistics.median(results[name][0]) - base_w) * 1000
            c_ms = (statistics.median(results[name][1]) - base_c) * 1000
            print(f"   egress adds ({name}): {w_ms:.0f} ms wall, {c_ms:.0f} ms cpu")
        if pid:
            os.kill(pid[0], 15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
