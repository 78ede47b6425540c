"""Network (M3): host unix sockets inside trees the sandbox has mounted.

A read-only bind does not stop `connect()` on a socket inode, so the classic
probes (host sockets under /tmp and /run, which a sandbox does not mount)
miss the case that matters: a host service listening in the workspace
(`WS/app.sock`, a dev server, a database) or in a `--ro`/`--rw` tree. Each
probe connects to such a host canary listener by its path and by a relative
path; the oracle is the listener's own log of the marker it received.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, HitLogged, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_CONNECT = """
  import os
  r, e = unix(P["{key}"], MARKER.encode() + b"\\n")
  net_report("{label}", r, e)
  os.chdir(P["{key}_dir"])
  r, e = unix("app.sock", MARKER.encode() + b"\\n")
  net_report("{label} (relative)", r, e)
  """


def _probe(
    pid: str,
    key: str,
    label: str,
    description: str,
    *,
    workspace: str | None = None,
    exec_args: tuple[str, ...] = (),
) -> Probe:
    return Probe(
        pid,
        "network",
        "M3",
        description,
        code(_CONNECT.format(key=key, label=label)),
        AnyOf((HitLogged((key,)), SecretSeen(("unix",)))),
        uses=(key,),
        workspace=workspace,
        exec_args=exec_args,
    )


PROBES: list[Probe] = [
    _probe(
        "net-unix-workspace-host-listener",
        "unix_ws",
        "unix in workspace",
        "connect to a host process's unix socket inside the workspace (WS/app.sock)",
        workspace="{unix_ws_dir}",
    ),
    _probe(
        "net-unix-ro-tree-host-listener",
        "unix_ro",
        "unix in --ro tree",
        "connect to a host unix socket inside a --ro tree (a read-only bind allows connect)",
        exec_args=("--ro", "{unix_ro_dir}"),
    ),
    _probe(
        "net-unix-rw-tree-host-listener",
        "unix_rw",
        "unix in --rw tree",
        "connect to a host unix socket inside a --rw tree",
        exec_args=("--rw", "{unix_rw_dir}"),
    ),
]
