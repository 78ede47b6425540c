"""Audit (M9): Landlock and seccomp denials reach the journal through kernel audit.

The attack is that a denial goes unrecorded: each probe is "allowed" unless a
journal row names the kind, the Landlock access or the syscall, and the
target. With kernel audit off they are not applicable (the runner says why);
`--backend none` performs the access unrestricted and journals nothing.
"""

from __future__ import annotations

from corral.verify.model import Need, Probe
from corral.verify.oracles import JournalHas
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_NEEDS: frozenset[Need] = frozenset({"journal", "kernel-audit"})

PROBES: list[Probe] = [
    Probe(
        "audit-kernel-landlock-access",
        "audit",
        "M9",
        "a Landlock denial (listing /) is journaled as kind landlock with access and path",
        code("""
          try:
              os.listdir("/")
              print("listdir /: allowed")
          except OSError as e:
              print("listdir /:", errname(e.errno))
          """),
        JournalHas(("landlock", "fs.read_dir /")),
        needs=_NEEDS,
    ),
    Probe(
        "audit-kernel-seccomp-syscall",
        "audit",
        "M9",
        "a seccomp EPERM denial (keyctl) is journaled as kind seccomp with the syscall name",
        code("""
          r, e = sysc("keyctl", 0, -3, 0)
          sys_result("keyctl", r, e)
          """),
        JournalHas(("seccomp", "keyctl")),
        needs=_NEEDS,
    ),
]
