"""Hostile output in files (M13): what a sandbox leaves on disk must not act on the host.

Setuid/setgid files, judged from the host's lstat of the file after teardown
(through the idmapped workspace they belong to the caller, root when corral
runs as root); grants through symlinks a sandbox planted (the host's canary
must stay unread and unwritten); and a journal placed where the sandbox can
rewrite it.
"""

from __future__ import annotations

from corral.verify.model import PathExists, Probe, SetIdMode, Symlink
from corral.verify.oracles import Fact, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_SETID: tuple[tuple[str, str, str], ...] = (
    (
        "chmod",
        "copy /usr/bin/id into the workspace and chmod it 04755",
        'shutil.copy("/usr/bin/id", F); os.chmod(F, 0o4755)',
    ),
    (
        "fchmodat2",
        "copy /usr/bin/id and set 06755 with the raw fchmodat2 syscall (nr 452)",
        'shutil.copy("/usr/bin/id", F); print("fchmodat2", '
        "_libc.syscall(452, ctypes.c_long(-100), F.encode(), 0o6755, 0))",
    ),
    (
        "open-creat",
        "create a file with open(O_CREAT, 04755)",
        "os.close(os.open(F, os.O_CREAT | os.O_WRONLY, 0o4755))",
    ),
    (
        "mknod",
        "create a regular file with mknod(S_IFREG | 04755)",
        "os.mknod(F, 0o104755)",
    ),
    (
        "install-m",
        "install /usr/bin/id with install -m 4755",
        'subprocess.run(["install", "-m", "4755", "/usr/bin/id", F], stderr=subprocess.DEVNULL)',
    ),
    (
        "cp-p-su",
        "copy the host's setuid /usr/bin/su with cp -p (mode preserved)",
        'subprocess.run(["cp", "-p", "/usr/bin/su", F], stderr=subprocess.DEVNULL)',
    ),
)


def _setid_probes() -> list[Probe]:
    return [
        Probe(
            f"hostile-setid-{name}",
            "host-integrity",
            "M13",
            f"{what}: the host must not end up with a setuid/setgid file",
            code(
                "import shutil, subprocess\n"
                'F = P["ws"] + "/setid-" + MARKER\n'
                "try:\n"
                f"    {attack}\n"
                "except OSError as e:\n"
                '    print("refused:", e)\n'
            ),
            Fact("setid", "a setuid/setgid file was left on the host"),
            checks=(SetIdMode("setid", "{ws}/setid-{marker}"),),
        )
        for name, what, attack in _SETID
    ]


_GRANTS: tuple[Probe, ...] = (
    Probe(
        "hostile-grant-symlink-ro",
        "host-integrity",
        "M13",
        "a later run's `--ro WS/docs`, where docs is a symlink a sandbox planted to a host "
        "directory, must not expose that directory",
        code('show("via --ro grant", read(P["ws"] + "/docs/secret.txt"))'),
        SecretSeen(("outside",)),
        steps=(Symlink("{ws}/docs", "{outside_dir}"),),
        exec_args=("--ro", "{ws}/docs"),
        needs=frozenset({"corral-options"}),
        uses=("f_outside",),
        refusal_ok=True,
    ),
    Probe(
        "hostile-grant-symlink-rw",
        "host-integrity",
        "M13",
        "a later run's `--rw WS/out`, where out is a planted symlink to a host directory, "
        "must not let the sandbox write there",
        code(
            'p = P["ws"] + "/out/" + MARKER\n'
            'try:\n    open(p, "w").write("x"); print("wrote", p)\n'
            'except OSError as e:\n    print("refused:", e)\n'
        ),
        Fact("wrote", "the sandbox created a file in the host directory behind the link"),
        steps=(Symlink("{ws}/out", "{outside_dir}"),),
        checks=(PathExists("wrote", "{outside_dir}/{marker}"),),
        exec_args=("--rw", "{ws}/out"),
        needs=frozenset({"corral-options"}),
        uses=("f_outside",),
        refusal_ok=True,
    ),
    Probe(
        "hostile-journal-in-workspace",
        "host-integrity",
        "M13",
        "a journal placed inside the workspace (`--journal WS/journal.sqlite`) must be "
        "refused: the sandbox would rewrite its own record",
        code(
            'j = P["ws"] + "/journal-" + MARKER + ".sqlite"\n'
            "try:\n"
            '    with open(j, "r+b") as f:\n'
            '        f.write(b"overwritten by the sandbox"); print("rewrote", j)\n'
            "except OSError as e:\n"
            '    print("no journal:", e)\n'
        ),
        Fact("journal", "a journal file sat inside the sandbox's writable workspace"),
        checks=(PathExists("journal", "{ws}/journal-{marker}.sqlite"),),
        journal="{ws}/journal-{marker}.sqlite",
        needs=frozenset({"corral-options"}),
        refusal_ok=True,
        baseline="the bare host keeps no journal, so there is none inside the workspace",
    ),
)

_CACHE = Probe(
    "hostile-cache-as-workspace",
    "host-integrity",
    "M13",
    "a sandbox given corral's cache (/var/cache/corral: the compiled init and seccomp "
    "filter of later sandboxes) as its workspace must be refused",
    code(
        'p = P["workspace"] + "/" + MARKER\n'
        'try:\n    open(p, "w").write("x"); print("wrote", p)\n'
        'except OSError as e:\n    print("refused:", e)\n'
    ),
    Fact("planted", "the sandbox wrote into corral's cache"),
    checks=(PathExists("planted", "/var/cache/corral/{marker}"),),
    workspace="/var/cache/corral",
    needs=frozenset({"corral-options", "root"}),
    refusal_ok=True,
)

PROBES: tuple[Probe, ...] = (*_setid_probes(), *_GRANTS, _CACHE)
