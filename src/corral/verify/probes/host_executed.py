"""Host-executed workspace files under `corral exec` (M6).

The user's next `git commit`, `cd` (direnv), editor or agent CLI runs what
these names hold. Each probe plants one from inside the sandbox. Oracles are
host-side: for git, the user's own plain `git status`/`commit` in the
repository after teardown (a planted command creates `{hits}/{marker}`, a
path the sandbox cannot see); for the other names, whether the file exists
(or changed) on the host after teardown. A peer that protects only files
that already exist (srt) shows the difference on the "create" probes.
"""

from __future__ import annotations

from corral.verify.model import FileChanged, GitRepo, HostGit, PathExists, Probe, WriteFile
from corral.verify.oracles import Fact
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_HELPERS = """
def plant(path, text, mode=0o644):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(text)
        os.chmod(path, mode)
        print("planted", path[len(P["ws"]):])
    except OSError as e:
        print("plant:", errname(e.errno))
def script(path):
    plant(path, "#!/bin/sh\\ntouch '%s/%s'\\nexit 0\\n" % (P["hits"], MARKER), 0o755)
    return path
def git_config(config, text):
    plant(config, text)
"""

_RAN = Fact("ran", "a planted command ran when the host used git ({hits}/{marker} appeared)")


def _git(pid: str, desc: str, body: str, *, repo: GitRepo, where: str = "{ws}") -> Probe:
    return Probe(
        pid,
        "host-integrity",
        "M6",
        desc,
        code(_HELPERS + code(body)),
        _RAN,
        steps=(repo,),
        checks=(HostGit("ran", plain=True, path=where),),
    )


def _create(pid: str, rel: str, content: str) -> Probe:
    return Probe(
        pid,
        "host-integrity",
        "M6",
        f"create {rel} in the workspace (absent before; the host would load it)",
        code(_HELPERS + f"plant(P['ws'] + {('/' + rel)!r}, {content!r} % MARKER)"),
        Fact("created", f"{rel} exists in the workspace on the host"),
        checks=(PathExists("created", "{ws}/" + rel),),
    )


PROBES: list[Probe] = [
    _git(
        "hostexec-git-hook",
        "plant .git/hooks/pre-commit; the user's own git commit runs it",
        'script(P["ws"] + "/.git/hooks/pre-commit")',
        repo=GitRepo(),
    ),
    _git(
        "hostexec-git-fsmonitor",
        "set core.fsmonitor in .git/config; the user's own git status runs it",
        """
         fsm = script(P["ws"] + "/.fsm.sh")
         git_config(P["ws"] + "/.git/config", "[core]\\n\\tfsmonitor = %s\\n" % fsm)
         """,
        repo=GitRepo(),
    ),
    _git(
        "hostexec-git-hooks-path",
        "point core.hooksPath at a workspace directory of hooks",
        """
         script(P["ws"] + "/.githooks/pre-commit")
         git_config(P["ws"] + "/.git/config", "[core]\\n\\thooksPath = .githooks\\n")
         """,
        repo=GitRepo(),
    ),
    Probe(
        "hostexec-git-user-hooks-path",
        "host-integrity",
        "M6",
        "create a hook in the directory the user's own core.hooksPath names (absent before)",
        code(_HELPERS + 'script(P["ws"] + "/.hooks/pre-commit")'),
        _RAN,
        steps=(
            GitRepo(),
            WriteFile(
                "{ws}/.git/config",
                "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\thooksPath = .hooks\n",
            ),
        ),
        checks=(HostGit("ran", plain=True),),
    ),
    _git(
        "hostexec-nested-repo-hook",
        "plant a pre-commit hook in a nested repository (vendor/lib/.git)",
        'script(P["ws"] + "/vendor/lib/.git/hooks/pre-commit")',
        repo=GitRepo(path="{ws}/vendor/lib"),
        where="{ws}/vendor/lib",
    ),
    _git(
        "hostexec-gitdir-hook",
        "plant a hook in a repository's separate gitdir (proj/.git is a gitdir: file)",
        'script(P["ws"] + "/store/hooks/pre-commit")',
        repo=GitRepo(path="{ws}/proj", git_dir="{ws}/store"),
        where="{ws}/proj",
    ),
    _create("hostexec-create-envrc", ".envrc", "touch /tmp/%s\n"),
    _create("hostexec-create-vscode-tasks", ".vscode/tasks.json", '{"label": "%s"}\n'),
    _create("hostexec-create-mcp-json", ".mcp.json", '{"mcpServers": {"%s": {}}}\n'),
    _create("hostexec-create-claude-settings", ".claude/settings.json", '{"x": "%s"}\n'),
    _create("hostexec-create-devcontainer", ".devcontainer/devcontainer.json", '{"x": "%s"}\n'),
    _create("hostexec-create-gitmodules", ".gitmodules", "# %s\n"),
    _create("hostexec-create-workspace-bashrc", ".bashrc", "# %s\n"),
    Probe(
        "hostexec-modify-envrc",
        "host-integrity",
        "M6",
        "append a command to the workspace's existing .envrc",
        code(_HELPERS + "plant(P['ws'] + '/.envrc', 'touch /tmp/%s\\n' % MARKER)"),
        Fact("changed", "the workspace's .envrc changed on the host"),
        steps=(WriteFile("{ws}/.envrc", "export CORRAL_VERIFY=1\n"),),
        checks=(FileChanged("changed", "{ws}/.envrc"),),
    ),
]
