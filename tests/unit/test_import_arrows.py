"""The package arrows point down (docs/design.md section 3), checked from source.

Every module under `src/corral` is parsed with `ast` (nothing is imported or
run) and each of its imports, lazy and type-only ones included, becomes an
edge. The rules are data below; the checker is a set of pure functions over a
graph, tested on synthetic graphs and on a temporary copy of the tree with a
deliberately bad import, so that the rules are known to bite.
"""

from __future__ import annotations

import ast
import functools
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# --- the rules (data) ---------------------------------------------------------

#: Area of a module: the longest matching prefix wins. Each area's typer
#: registration (`<area>/cli.py`) is a shell above every composer, so it is
#: "cli"; `exec/cli.py` is `corral exec`'s own parser, part of the composition.
AREA_PREFIXES: tuple[tuple[str, str], ...] = (
    ("corral", "corral"),
    ("corral.__main__", "cli"),
    ("corral.cli", "cli"),
    ("corral.doctor_cli", "cli"),
    ("corral.agents.cli", "cli"),
    ("corral.broker.cli", "cli"),
    ("corral.provider.cli", "cli"),
    ("corral.run.cli", "cli"),
    ("corral.verify.cli", "cli"),
    ("corral.dashboard", "dashboard"),
    ("corral.k8s", "k8s"),
    ("corral.store", "store"),
    ("corral.store.cli", "cli"),
    ("corral.k8s.cli", "cli"),
    # A backend and its pure rendering: they import nothing above the sandbox.
    ("corral.k8s.backend", "sandbox"),
    ("corral.k8s.names", "sandbox"),
    ("corral.k8s.render", "sandbox"),
    ("corral.k8s.yaml_out", "sandbox"),
    ("corral.viewer", "viewer"),
    ("corral.run", "run"),
    ("corral.exec", "exec"),
    ("corral.verify", "verify"),
    ("corral.doctor", "doctor"),
    ("corral.doctorview", "doctor"),
    ("corral.helpview", "base"),
    ("corral.agents", "agents"),
    ("corral.broker", "broker"),
    ("corral.provider", "provider"),
    ("corral.hostgit", "hostgit"),
    ("corral.sandbox", "sandbox"),
    ("corral.sandbox.spec", "spec"),
    ("corral.errors", "errors"),
    ("corral.boundedjson", "base"),
    ("corral.display", "base"),
    ("corral.sqlrows", "base"),
    ("corral.usage", "base"),
    ("corral.pauseclock", "base"),
    ("corral.watch", "base"),
    # The package itself only says where payload files lie (read as data);
    # its modules run inside sandboxes and are never imported by host code.
    ("corral._payload", "payload-path"),
    ("corral._payload.", "payload"),
)

#: cli -> run/exec/verify/doctor/dashboard/viewer -> agents/broker/provider -> sandbox -> spec
LAYER: Mapping[str, int] = {
    "cli": 5,
    "run": 4,
    "exec": 4,
    "verify": 4,
    "doctor": 4,
    "dashboard": 4,
    "viewer": 4,
    "k8s": 4,
    "store": 4,
    "agents": 3,
    "broker": 3,
    "provider": 3,
    "hostgit": 3,
    "sandbox": 2,
    "base": 1,  # small shared helpers (bounded JSON, display, SQLite rows, usage)
    "payload-path": 1,
    "spec": 0,
    "errors": 0,
    "corral": 0,
    "payload": 0,
}

#: Imports between two areas of the same layer, each with its reason.
SAME_LAYER: Mapping[tuple[str, str], str] = {
    ("run", "exec"): "an agent session's spec is built by corral exec's own parser",
    ("verify", "run"): "verify drives missions through corral run and reads its store",
    ("verify", "doctor"): "verify asks the doctor whether kernel audit is on",
    ("agents", "broker"): "an agent's provider route is a broker route config (pure data)",
    ("dashboard", "run"): "the dashboard reads run state and calls run control (stop, pause)",
    ("store", "run"): "a fleet worker drives runs with corral run's coordinator",
    ("k8s", "run"): "renders the environments corral run would start",
    ("verify", "viewer"): "the M11 probes attack the real viewer",
    ("verify", "exec"): "the launcher probe speaks the real launcher's protocol (build id)",
    ("viewer", "run"): "the viewer starts a run's product the way corral run does",
    ("viewer", "dashboard"): "corral view serves the dashboard with the viewer mounted in it",
}

#: Areas that may import only these areas (besides their own).
ONLY: Mapping[str, frozenset[str]] = {
    # "base" holds pure helpers (bounded JSON, display sanitising) below the sandbox.
    "sandbox": frozenset({"spec", "errors", "payload-path", "base"}),
    "spec": frozenset(),
    "errors": frozenset(),
    "payload-path": frozenset(),
    "payload": frozenset(),
}

#: Modules whose job is decisions and data: they import no I/O module, directly
#: or through any corral module they import, and call no os process function.
PURE: frozenset[str] = frozenset(
    {
        "corral.errors",
        "corral.pauseclock",
        "corral.sandbox.spec",
        "corral.sandbox.bwrap",
        "corral.sandbox.units",
        "corral.broker.actions",
        "corral.broker.hosts",
        "corral.broker.wire",
        "corral.broker.config",
        "corral.broker.policy",
        "corral.broker.proxy_env",
        "corral.provider.scenario",
        "corral.provider.conversation",
        "corral.provider.intents",
        "corral.provider.engine",
        "corral.provider.wire",
        "corral.agents.base",
        "corral.agents.routes",
        "corral.agents.launch",
        "corral.agents.claude_code",
        "corral.agents.codex",
        "corral.agents.gemini",
        "corral.agents.registry",
        "corral.run.mission",
        "corral.run.environments",
        "corral.verify.model",
        "corral.verify.oracles",
        "corral.verify.missions",
    }
)

IO_MODULES: frozenset[str] = frozenset(
    {
        "subprocess",
        "socket",
        "ssl",
        "select",
        "selectors",
        "asyncio",
        "multiprocessing",
        "threading",
        "signal",
        "pty",
        "termios",
        "fcntl",
        "ctypes",
        "shutil",
        "sqlite3",
        "http.client",
        "http.server",
        "urllib.request",
        "aiohttp",
        "starlette",
        "uvicorn",
        "psycopg",
        "mcp",
    }
)

OS_PROCESS_CALLS: frozenset[str] = frozenset(
    {"system", "popen", "fork", "forkpty", "kill", "killpg", "waitpid", "wait", "posix_spawn"}
    | {"posix_spawnp", "execv", "execve", "execvp", "execvpe", "execl", "execlp", "execle"}
    | {"spawnv", "spawnve", "spawnl", "setsid", "setns", "unshare", "pidfd_open"}
)

# --- the checker (pure) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Module:
    """One parsed module: what it imports (module names) and its os process calls."""

    name: str
    imports: tuple[tuple[str, int], ...]
    os_calls: tuple[tuple[str, int], ...] = ()


def parse_module(name: str, source: str, *, is_package: bool, known: Iterable[str]) -> Module:
    """Imports of `source` as absolute module names: `from a import b` is `a.b`
    when that is a known module, else `a`. Nothing is executed."""
    known_set = set(known)
    tree = ast.parse(source)
    pkg = name if is_package else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    calls: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for a in node.names:
                full = f"{base}.{a.name}"
                found.append((full if full in known_set else base, node.lineno))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "os"
            and node.func.attr in OS_PROCESS_CALLS
        ):
            calls.append((f"os.{node.func.attr}", node.lineno))
    return Module(name, tuple(found), tuple(calls))


def area_of(module: str) -> str | None:
    """The area of a corral module, None for a module outside corral."""
    best: tuple[int, str] | None = None
    for prefix, area in AREA_PREFIXES:
        hit = (
            module.startswith(prefix)
            if prefix.endswith(".")
            else module == prefix or module.startswith(prefix + ".")
        )
        if hit and (best is None or len(prefix) > best[0]):
            best = (len(prefix), area)
    return best[1] if best else None


def _corral_edges(graph: Mapping[str, Module]) -> Iterable[tuple[str, str, int]]:
    for mod in graph.values():
        for target, line in mod.imports:
            if target == "corral" or target.startswith("corral."):
                yield mod.name, target, line


def layer_violations(graph: Mapping[str, Module]) -> list[str]:
    """Every import that points up, sideways without a reason, or outside its ONLY set."""
    out = []
    for src, dst, line in _corral_edges(graph):
        a, b = area_of(src), area_of(dst)
        if a is None or b is None or a == b:
            continue
        if a in ONLY and b not in ONLY[a]:
            out.append(f"{src}:{line} imports {dst} ({a} may import only {sorted(ONLY[a])})")
        elif LAYER[b] > LAYER[a] or (LAYER[b] == LAYER[a] and (a, b) not in SAME_LAYER):
            out.append(f"{src}:{line} imports {dst} ({a} -> {b} points up or sideways)")
    return out


def package_cycles(graph: Mapping[str, Module]) -> list[list[str]]:
    """Cycles in the area graph (each as the list of areas around it)."""
    edges: dict[str, set[str]] = {}
    for src, dst, _ in _corral_edges(graph):
        a, b = area_of(src), area_of(dst)
        if a is not None and b is not None and a != b:
            edges.setdefault(a, set()).add(b)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                cycles.append([*stack[stack.index(m) :], m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return cycles


def purity_violations(graph: Mapping[str, Module], pure: Iterable[str]) -> list[str]:
    """For each pure module: an I/O import or os process call reached through it."""
    out = []
    for root in sorted(pure):
        if root not in graph:
            out.append(f"{root}: listed as pure but not found")
            continue
        seen = {root}
        todo: list[tuple[str, tuple[str, ...]]] = [(root, (root,))]
        while todo:
            name, path = todo.pop()
            mod = graph[name]
            via = " -> ".join(path)
            for call, line in mod.os_calls:
                out.append(f"{root}: {via}:{line} calls {call}")
            for target, line in mod.imports:
                top = target.split(".")[0]
                if target in IO_MODULES or top in IO_MODULES:
                    out.append(f"{root}: {via}:{line} imports {target}")
                elif target in graph and target not in seen:
                    seen.add(target)
                    todo.append((target, (*path, target)))
    return out


def payload_violations(graph: Mapping[str, Module]) -> list[str]:
    """Payload modules import nothing of corral; host modules import no payload module."""
    out = []
    for src, dst, line in _corral_edges(graph):
        a, b = area_of(src), area_of(dst)
        if a == "payload" and dst != src:
            out.append(f"{src}:{line} imports {dst} (payload code is stdlib only)")
        elif b == "payload" and a != "payload":
            out.append(f"{src}:{line} imports {dst} (host code reads payload files as data)")
    return out


def check(graph: Mapping[str, Module], pure: Iterable[str] = PURE) -> list[str]:
    """Every rule's violations, one line each; empty when the arrows point down."""
    cycles = [" -> ".join(c) for c in package_cycles(graph)]
    return [
        *layer_violations(graph),
        *(f"package cycle: {c}" for c in cycles),
        *purity_violations(graph, pure),
        *payload_violations(graph),
    ]


# --- the shell: read a tree -----------------------------------------------------


def collect(src: Path) -> dict[str, Module]:
    """Parse every module below `src` (a directory holding the `corral` package)."""
    paths: dict[str, Path] = {}
    for p in sorted((src / "corral").rglob("*.py")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        paths[".".join(parts)] = p
    return {
        name: parse_module(
            name, p.read_text(encoding="utf-8"), is_package=p.name == "__init__.py", known=paths
        )
        for name, p in paths.items()
    }


# --- the tree ----------------------------------------------------------------------


@functools.cache
def _tree() -> dict[str, Module]:
    return collect(SRC)


def test_the_arrows_point_down() -> None:
    graph = _tree()
    assert len(graph) > 100  # the tree was found
    assert check(graph) == []


def test_every_module_has_an_area() -> None:
    assert [m for m in _tree() if area_of(m) is None] == []


def test_a_bad_import_in_a_copy_of_the_tree_is_caught(tmp_path: Path) -> None:
    shutil.copytree(SRC / "corral", tmp_path / "corral")
    spec = tmp_path / "corral" / "sandbox" / "spec.py"
    spec.write_text(spec.read_text() + "\nfrom corral.run import coordinator\n")
    env = tmp_path / "corral" / "run" / "environments.py"
    env.write_text(env.read_text() + "\nimport subprocess\n")
    found = check(collect(tmp_path))
    assert any("corral.sandbox.spec:" in v and "corral.run.coordinator" in v for v in found)
    assert any("package cycle" in v for v in found)  # run -> spec -> run
    assert any(v.startswith("corral.run.environments: ") and "subprocess" in v for v in found)


# --- the checker on synthetic graphs ---------------------------------------------------


def _g(*mods: tuple[str, tuple[str, ...]]) -> dict[str, Module]:
    return {n: Module(n, tuple((t, 1) for t in imps)) for n, imps in mods}


def test_checker_accepts_a_downward_graph() -> None:
    g = _g(
        ("corral.cli", ("corral.exec.cli",)),
        ("corral.exec.cli", ("corral.sandbox.spec", "corral.broker.attach")),
        ("corral.broker.attach", ("corral.errors",)),
        ("corral.sandbox.namespace", ("corral.sandbox.spec", "corral._payload", "os")),
        ("corral.sandbox.spec", ()),
        ("corral.errors", ()),
        ("corral._payload", ("os",)),
    )
    assert check(g, pure={"corral.sandbox.spec"}) == []


def test_checker_flags_upward_and_sideways_imports() -> None:
    g = _g(
        ("corral.sandbox.namespace", ("corral.broker.journal",)),
        ("corral.broker.journal", ("corral.run.store",)),
        ("corral.provider.engine", ("corral.broker.config",)),
        ("corral.broker.config", ()),
        ("corral.run.store", ()),
    )
    found = layer_violations(g)
    assert len(found) == 3
    assert "corral.sandbox.namespace:1 imports corral.broker.journal" in found[0]
    assert "broker -> run" in found[1]
    assert "provider -> broker" in found[2]


def test_checker_finds_a_package_cycle() -> None:
    g = _g(
        ("corral.exec.compose", ("corral.run.store",)),
        ("corral.run.agent_run", ("corral.exec.cli",)),
        ("corral.exec.cli", ()),
        ("corral.run.store", ()),
    )
    assert package_cycles(g) == [["exec", "run", "exec"]]


def test_checker_follows_io_through_corral_modules() -> None:
    g = _g(
        ("corral.run.environments", ("corral.broker.attach",)),
        ("corral.broker.attach", ("corral.broker.process",)),
        ("corral.broker.process", ("subprocess",)),
    )
    g["corral.sandbox.bwrap"] = Module("corral.sandbox.bwrap", (), (("os.fork", 7),))
    found = purity_violations(g, {"corral.run.environments", "corral.sandbox.bwrap"})
    assert found == [
        "corral.run.environments: corral.run.environments -> corral.broker.attach"
        " -> corral.broker.process:1 imports subprocess",
        "corral.sandbox.bwrap: corral.sandbox.bwrap:7 calls os.fork",
    ]


def test_checker_keeps_payload_apart() -> None:
    g = _g(
        ("corral.sandbox.namespace", ("corral._payload.init",)),
        ("corral._payload.init", ("corral.errors",)),
        ("corral.errors", ()),
    )
    assert len(payload_violations(g)) == 2


def test_parse_module_resolves_relative_and_lazy_imports() -> None:
    src = (
        "from . import bwrap\n"
        "from .spec import SandboxSpec\n"
        "def f():\n"
        "    import subprocess\n"
        "    os.kill(1, 9)\n"
        "if TYPE_CHECKING:\n"
        "    from corral.broker.journal import Journal\n"
    )
    known = {"corral.sandbox.bwrap", "corral.sandbox.spec", "corral.broker.journal"}
    m = parse_module("corral.sandbox.namespace", src, is_package=False, known=known)
    assert [t for t, _ in m.imports] == [
        "corral.sandbox.bwrap",
        "corral.sandbox.spec",
        "subprocess",
        "corral.broker.journal",
    ]
    assert m.os_calls == (("os.kill", 5),)
