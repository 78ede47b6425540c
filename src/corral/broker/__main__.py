"""`python -m corral.broker serve ...`: the broker process (see docs/broker.md).

Kept free of typer and rich so that the broker starts quickly next to a
sandbox.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m corral.broker")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the egress broker until SIGTERM")
    serve.add_argument("--config", required=True, help="BrokerConfig JSON file, or - for stdin")
    serve.add_argument("--journal", required=True, type=Path, help="journal SQLite file")
    serve.add_argument("--run", default=None)
    serve.add_argument("--session", default=None)
    serve.add_argument("--env", default="exec", choices=("exec", "agent", "product", "verifier"))
    serve.add_argument("--listen-fd", type=int, action="append", default=[], metavar="N")
    serve.add_argument("--listen", action="append", default=[], metavar="HOST:PORT")
    serve.add_argument("--listen-unix", action="append", default=[], metavar="PATH")
    serve.add_argument(
        "--control", type=Path, default=None, metavar="PATH", help="live-policy control socket"
    )
    serve.add_argument("--ready-fd", type=int, default=None, metavar="M")
    serve.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        metavar="PID",
        help="exit (SIGTERM) when this parent dies",
    )
    resident = sub.add_parser("resident", help="serve many sandboxes' listeners until idle")
    resident.add_argument("--socket", required=True, type=Path, metavar="PATH")
    resident.add_argument("--idle-s", type=float, default=30.0, metavar="S")
    resident.add_argument("--ready-fd", type=int, default=None, metavar="M")
    resident.add_argument("--pauses", default=None, metavar="PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` and serve; the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "resident":
        from corral.broker.resident_server import ResidentOptions, serve_resident

        return serve_resident(ResidentOptions(args.socket, args.idle_s, args.ready_fd, args.pauses))
    from corral.broker.actions import Identity
    from corral.broker.config import BrokerConfig
    from corral.broker.server import ServeOptions, serve
    from corral.errors import ConfigError

    try:
        if args.config == "-":
            text = sys.stdin.buffer.read()
        else:
            with open(args.config, "rb") as fh:
                text = fh.read()
        config = BrokerConfig.from_json(text)
    except (OSError, ConfigError) as exc:
        print(f"corral broker: {exc}", file=sys.stderr)
        return 2
    options = ServeOptions(
        config=config,
        journal=args.journal,
        identity=Identity(run=args.run, session=args.session, env=args.env),
        listen_fds=tuple(args.listen_fd),
        listen=tuple(args.listen),
        listen_unix=tuple(args.listen_unix),
        ready_fd=args.ready_fd,
        parent_pid=args.parent_pid,
        control=args.control,
    )
    return serve(options)


if __name__ == "__main__":
    sys.exit(main())
