"""A raw launcher client (stdlib only): the attacker's tool in the launcher tests.

    python3 launcher_client.py SOCKET BUILD_ID exec [OPTIONS] -- CMD...

Tries SOCKET, then every launcher socket it can find under the usual bases,
and asks the first that accepts a connection to run `corral exec ...` with
this process's stdio and working directory. Prints what happened on stderr;
exits 0 when a launcher answered "A" (accepted), 3 when none could be reached.
"""

from __future__ import annotations

import glob
import os
import socket
import struct
import sys


def request(path: str, build_id: str, argv: list[str]) -> str:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(path)
    fields = [build_id, f"{os.umask(0o022):o}", "", str(len(argv)), *argv]
    fields += [f"{k}={v}" for k, v in os.environ.items()]
    body = b"".join(os.fsencode(f) + b"\0" for f in fields)
    cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    head = b"CRL1" + struct.pack("!I", len(body))
    fds = struct.pack("4i", 0, 1, 2, cwd)
    sock.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    sock.sendall(body)
    replies = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            break
        replies += chunk
    return replies.decode(errors="replace")


def main() -> int:
    path, build_id, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    candidates = [path]
    for pattern in ("/tmp/corral-*/launcher/*.sock", "/run/user/*/corral-*/launcher/*.sock"):
        candidates += glob.glob(pattern)
    for candidate in candidates:
        try:
            replies = request(candidate, build_id, argv)
        except OSError as exc:
            sys.stderr.write(f"launcher_client: {candidate}: {exc}\n")
            continue
        sys.stderr.write(f"launcher_client: {candidate}: replies {replies!r}\n")
        if replies.startswith("A"):
            return 0
    return 3


if __name__ == "__main__":
    raise SystemExit(main())
