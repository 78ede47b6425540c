"""Host-wide kernel counters a probe's oracle can compare before and during a run."""

from __future__ import annotations

__all__ = ["host_sock_mem_bytes", "parse_sockstat_mem"]

_PAGE = 4096


def parse_sockstat_mem(text: str) -> int:
    """Bytes of TCP + UDP buffer memory in /proc/net/sockstat text.

    The `mem` fields count pages of the protocol's host-global allocation,
    whatever network namespace the sockets live in, so a sandbox with its
    own netns still shows up in the host's file.
    """
    total = 0
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in ("TCP:", "UDP:") and "mem" in fields:
            i = fields.index("mem")
            if i + 1 < len(fields) and fields[i + 1].isdigit():
                total += int(fields[i + 1]) * _PAGE
    return total


def host_sock_mem_bytes() -> int:
    """TCP + UDP buffer bytes the host kernel holds now (0 when unreadable)."""
    try:
        with open("/proc/net/sockstat", encoding="ascii") as fh:
            return parse_sockstat_mem(fh.read())
    except OSError:
        return 0
