"""Host integrity (M6): content the sandbox writes into the workspace is never
executed or interpreted on the host when corral later touches the workspace.

Each git probe plants a hook or a config-driven command that, if it ever runs,
creates `{hits}/{marker}` on the host (a path the sandbox cannot see). After
the sandbox is gone the runner runs git over the workspace on the host:
corral's own helper (`corral.hostgit.safe_git`) for corral backends, plain
`git` for the baseline and the peers (which ship no host-side git helper).
TIOCSTI is a privilege probe living here because it attacks the host's
terminal.
"""

from __future__ import annotations

from corral.verify.model import FileChanged, GitRepo, HostGit, Probe, TtyInjected
from corral.verify.oracles import Fact
from corral.verify.probes._dsl import code
from corral.verify.probes._mission import M6_PROBES, M12_PROBES

__all__ = ["PROBES"]

_HELPERS = """
def script(path, body="exit 0"):
    with open(path, "w") as f:
        f.write("#!/bin/sh\\ntouch '%s/%s'\\n%s\\n" % (P["hits"], MARKER, body))
    os.chmod(path, 0o755)
    return path
def git_config(text):
    with open(P["ws"] + "/.git/config", "a") as f:
        f.write(text)
def change(name="README.txt"):
    with open(P["ws"] + "/" + name, "a") as f:
        f.write("changed by the sandbox\\n")
"""

_RAN = Fact("ran", "workspace content ran on the host ({hits}/{marker} appeared)")


def _git(pid: str, desc: str, body: str) -> Probe:
    return Probe(
        pid,
        "host-integrity",
        "M6",
        desc,
        code(_HELPERS + code(body)),
        _RAN,
        steps=(GitRepo(),),
        checks=(HostGit("ran"),),
        needs=frozenset({"hostgit"}),
    )


PROBES: list[Probe] = [
    _git(
        "hostint-git-hook-pre-commit",
        "plant .git/hooks/pre-commit (runs when the host commits)",
        """
         script(P["ws"] + "/.git/hooks/pre-commit")
         change()
         """,
    ),
    _git(
        "hostint-git-hook-post-commit",
        "plant .git/hooks/post-commit",
        """
         script(P["ws"] + "/.git/hooks/post-commit")
         change()
         """,
    ),
    _git(
        "hostint-git-hook-reference-transaction",
        "plant .git/hooks/reference-transaction (any ref update)",
        """
         script(P["ws"] + "/.git/hooks/reference-transaction")
         change()
         """,
    ),
    _git(
        "hostint-git-hook-post-index-change",
        "plant .git/hooks/post-index-change (git add / status)",
        """
         script(P["ws"] + "/.git/hooks/post-index-change")
         change()
         """,
    ),
    _git(
        "hostint-git-hooks-path",
        "point core.hooksPath at a hooks directory inside the workspace",
        """
         os.makedirs(P["ws"] + "/.githooks", exist_ok=True)
         script(P["ws"] + "/.githooks/pre-commit")
         git_config("[core]\\n\\thooksPath = .githooks\\n")
         change()
         """,
    ),
    _git(
        "hostint-git-fsmonitor",
        "set core.fsmonitor to a workspace script (runs on git status)",
        """
         git_config("[core]\\n\\tfsmonitor = %s\\n" % script(P["ws"] + "/.fsm.sh"))
         change()
         """,
    ),
    _git(
        "hostint-git-diff-external",
        "set diff.external to a workspace script (runs on git diff)",
        """
         git_config("[diff]\\n\\texternal = %s\\n" % script(P["ws"] + "/.dx.sh"))
         change()
         """,
    ),
    _git(
        "hostint-git-textconv",
        "set a diff textconv driver via .gitattributes (runs on git diff)",
        """
         with open(P["ws"] + "/.gitattributes", "w") as f:
             f.write("*.txt diff=cv\\n")
         tc = script(P["ws"] + "/.tc.sh", 'cat "$1"')
         git_config("[diff \\"cv\\"]\\n\\ttextconv = %s\\n" % tc)
         change()
         """,
    ),
    _git(
        "hostint-git-filter-clean",
        "set a clean filter via .gitattributes (runs on git add / status)",
        """
         with open(P["ws"] + "/.gitattributes", "w") as f:
             f.write("*.txt filter=cv\\n")
         git_config("[filter \\"cv\\"]\\n\\tclean = %s\\n" % script(P["ws"] + "/.clean.sh", "cat"))
         change()
         """,
    ),
    _git(
        "hostint-git-gpg-program",
        "enable commit signing with gpg.program set to a workspace script",
        """
         gpg = script(P["ws"] + "/.gpg.sh", "exit 1")
         git_config("[commit]\\n\\tgpgsign = true\\n[gpg]\\n\\tprogram = %s\\n" % gpg)
         change()
         """,
    ),
    _git(
        "hostint-git-include",
        "include a workspace file from .git/config that sets core.fsmonitor",
        """
         with open(P["ws"] + "/.inc-config", "w") as f:
             f.write("[core]\\n\\tfsmonitor = %s\\n" % script(P["ws"] + "/.fsm2.sh"))
         git_config("[include]\\n\\tpath = ../.inc-config\\n")
         change()
         """,
    ),
    *M6_PROBES,
    *M12_PROBES,
    Probe(
        "hostint-bashrc",
        "host-integrity",
        "M6",
        "append a line (a harmless comment) to the caller's ~/.bashrc",
        code("""
          try:
              with open(P["home"] + "/.bashrc", "a") as f:
                  f.write("# corral-verify " + MARKER + "\\n")
          except OSError as e:
              print("write:", errname(e.errno))
          """),
        Fact("changed", "the caller's ~/.bashrc changed"),
        checks=(FileChanged("changed", "{home}/.bashrc"),),
    ),
    Probe(
        "hostint-profile",
        "host-integrity",
        "M6",
        "append a line (a harmless comment) to the caller's ~/.profile",
        code("""
          try:
              with open(P["home"] + "/.profile", "a") as f:
                  f.write("# corral-verify " + MARKER + "\\n")
          except OSError as e:
              print("write:", errname(e.errno))
          """),
        Fact("changed", "the caller's ~/.profile changed"),
        checks=(FileChanged("changed", "{home}/.profile"),),
    ),
    Probe(
        "hostint-tiocsti",
        "host-integrity",
        "M8",
        "inject keystrokes into the caller's terminal with TIOCSTI (CVE-2017-5226)",
        code("""
          import fcntl
          n = 0
          err = None
          for ch in ("# " + MARKER + "\\n").encode():
              try:
                  fcntl.ioctl(0, 0x5412, bytes([ch]))
                  n += 1
              except OSError as e:
                  err = errname(e.errno)
                  break
          result(n > 0, injected=n, errno=err)
          """),
        Fact("injected", "bytes with the marker reached the caller's terminal"),
        needs=frozenset({"pty"}),
        checks=(TtyInjected("injected"),),
        serial=True,
    ),
]
