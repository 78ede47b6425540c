"""The host-executed file list, the bounded scan and the plan (no sandbox)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from corral.errors import LayerUnavailableError, SandboxStartError, UsageError
from corral.sandbox import protect as pr
from corral.sandbox.bwrap import StagedBind
from corral.sandbox.protect import Guard, Placeholders, ProtectPlan, RepoFact, TreeFacts

if TYPE_CHECKING:
    from corral.sandbox.protect import Kind


def _facts(
    tree: str = "/w",
    *,
    top: dict[str, Kind | None] | None = None,
    deep: tuple[tuple[str, Kind], ...] = (),
    repos: tuple[RepoFact, ...] = (),
) -> TreeFacts:
    names: dict[str, Kind | None] = dict.fromkeys(pr.PROTECTED_NAMES)
    names.update(top or {})
    return TreeFacts(tree=tree, top=tuple(names.items()), deep=deep, repos=repos)


def _by_path(plan: ProtectPlan) -> dict[str, Guard]:
    return {g.path: g for g in plan.guards}


def test_missing_names_get_placeholders_of_the_right_kind() -> None:
    guards = _by_path(pr.plan([_facts()], frozenset()))
    assert set(guards) == {f"/w/{n}" for n in pr.PROTECTED_NAMES}
    assert guards["/w/.git"].create == "dir"
    assert guards["/w/.vscode"].create == "dir"
    assert guards["/w/.envrc"].create == "file"
    assert guards["/w/.bashrc"].create == "file"


def test_existing_names_are_bound_over_themselves() -> None:
    facts = _facts(top={".git": "dir", ".envrc": "file"}, repos=(RepoFact("/w/.git", "dir"),))
    guards = _by_path(pr.plan([facts], frozenset()))
    assert guards["/w/.git"].create is None
    assert guards["/w/.envrc"].create is None


def test_unprotect_removes_names_everywhere() -> None:
    facts = _facts(repos=(RepoFact("/w/sub/.git", "dir"),), deep=(("/w/sub/.envrc", "file"),))
    plan = pr.plan([facts], frozenset({".git", ".envrc"}))
    paths = {g.path for g in plan.guards}
    assert not any(p.endswith((".git", ".envrc")) for p in paths)
    assert plan.unprotected == (".envrc", ".git")
    assert plan.summary()["unprotected"] == [".envrc", ".git"]


def test_nested_repositories_and_deep_names_are_protected() -> None:
    facts = _facts(
        repos=(RepoFact("/w/a/b/.git", "dir"), RepoFact("/w/c/.git", "file")),
        deep=(("/w/a/.vscode", "dir"),),
    )
    guards = _by_path(pr.plan([facts], frozenset()))
    assert guards["/w/a/b/.git"].why == "repository"
    assert guards["/w/c/.git"].create is None
    assert guards["/w/a/.vscode"].create is None


def test_worktree_gitdir_protected_only_inside_a_writable_tree() -> None:
    repos = (
        RepoFact("/w/wt/.git", "file", gitdir="/w/store/worktrees/wt", commondir="/w/store"),
        RepoFact("/w/x/.git", "file", gitdir="/elsewhere/.git", commondir=None),
    )
    guards = _by_path(pr.plan([_facts(repos=repos), _facts("/rw")], frozenset()))
    assert guards["/w/store"].why == "worktree gitdir"  # holds the gitdir too
    assert "/elsewhere/.git" not in guards
    only_gitdir = (RepoFact("/w/wt/.git", "file", gitdir="/w/g/wt", commondir="/elsewhere"),)
    guards = _by_path(pr.plan([_facts(repos=only_gitdir)], frozenset()))
    assert guards["/w/g/wt"].why == "worktree gitdir"
    assert "/elsewhere" not in guards
    # a gitdir in another writable tree (an --rw grant) is protected too
    repos2 = (RepoFact("/w/.git", "file", gitdir="/rw/st/worktrees/w", commondir="/rw/st"),)
    facts2 = _facts(top={".git": "file"}, repos=repos2)
    guards2 = _by_path(pr.plan([facts2, _facts("/rw")], frozenset()))
    assert "/rw/st" in guards2
    assert guards2["/w/.git"].create is None  # the gitdir: file itself


@pytest.mark.parametrize(
    "facts",
    [
        _facts(top={".envrc": "symlink"}),
        _facts(deep=(("/w/a/.bashrc", "symlink"),)),
        _facts(repos=(RepoFact("/w/a/.git", "symlink"),)),
    ],
)
def test_symlinked_names_are_refused(facts: TreeFacts) -> None:
    with pytest.raises(LayerUnavailableError) as exc:
        pr.plan([facts], frozenset())
    assert exc.value.layer == "protect"
    assert "--unprotect" in str(exc.value)


def test_symlink_under_an_unprotected_name_is_accepted() -> None:
    plan = pr.plan([_facts(top={".envrc": "symlink"})], frozenset({".envrc"}))
    assert "/w/.envrc" not in _by_path(plan)


def test_writable_tree_inside_dot_git_is_refused() -> None:
    with pytest.raises(LayerUnavailableError, match=r"inside a \.git directory"):
        pr.plan([_facts("/p/.git/hooks")], frozenset())
    assert pr.plan([_facts("/p/.git/hooks")], frozenset({".git"})).guards


def test_guard_cap_marks_the_plan_truncated() -> None:
    deep: tuple[tuple[str, Kind], ...] = tuple(
        (f"/w/d{i}/.envrc", "file") for i in range(pr.MAX_GUARDS)
    )
    plan = pr.plan([_facts(deep=deep)], frozenset())
    assert len(plan.guards) + len(plan.pins) == pr.MAX_GUARDS
    assert plan.truncated
    # the top-level names come first: they are never what the cap drops
    assert {f"/w/{n}" for n in pr.PROTECTED_NAMES} <= {g.path for g in plan.guards}


def test_guards_are_ordered_parents_first() -> None:
    facts = _facts(repos=(RepoFact("/w/a/b/c/.git", "dir"), RepoFact("/w/a/.git", "dir")))
    depths = [g.path.count("/") for g in pr.plan([facts], frozenset()).guards]
    assert depths == sorted(depths)


def test_validate_unprotect() -> None:
    assert pr.validate_unprotect([".git", ".git", ".envrc"]) == {".git", ".envrc"}
    with pytest.raises(UsageError, match="README"):
        pr.validate_unprotect(["README"])


def test_bind_pairs_use_the_staged_source_and_pin_parents() -> None:
    plan = pr.plan(
        [
            _facts(top={".git": "dir"}, repos=(RepoFact("/w/.git", "dir"),)),
            _facts("/w/sub", repos=(RepoFact("/w/sub/x/y/.git", "dir"),)),
        ],
        frozenset(),
    )
    assert plan.pins == ("/w/sub/x", "/w/sub/x/y")
    sources = [("/w", "/run/corral-stage/0"), ("/w/sub", "/run/corral-stage/2")]
    binds = {b.dest: b for b in pr.bind_pairs(plan, sources)}
    assert binds["/w/.git"] == StagedBind("/run/corral-stage/0/.git", "/w/.git", False)
    assert binds["/w/sub/x"] == StagedBind("/run/corral-stage/2/x", "/w/sub/x", True)
    assert binds["/w/sub/x/y/.git"].writable is False
    dests = [b.dest for b in pr.bind_pairs(plan, sources)]
    assert dests.index("/w/sub/x") < dests.index("/w/sub/x/y") < dests.index("/w/sub/x/y/.git")


def test_paths_inside_a_protected_directory_are_not_bound_again() -> None:
    facts = _facts(
        top={".vscode": "dir"},
        repos=(RepoFact("/w/.vscode/ext/.git", "dir"),),
        deep=(("/w/.vscode/ext/.envrc", "file"),),
    )
    plan = pr.plan([facts], frozenset())
    assert not any(g.path.startswith("/w/.vscode/") for g in plan.guards)
    assert plan.pins == ()  # a writable pin would re-open the read-only .vscode


# -- the scan (real files in tmp_path) -------------------------------------------------


def test_scan_finds_nested_repos_with_byte_names_and_skips_symlinks(tmp_path: Path) -> None:
    odd = os.fsencode(tmp_path) + b"/caf\xe9-\xff"
    os.makedirs(odd + b"/.git/hooks")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / ".git").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")  # not followed: found once, via real/
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / ".idea").mkdir()
    facts = pr.scan_tree(str(tmp_path))
    paths = sorted(r.path for r in facts.repos)
    assert paths == sorted([os.fsdecode(odd + b"/.git"), str(tmp_path / "real" / ".git")])
    assert (str(tmp_path / "a" / "b" / ".idea"), "dir") in facts.deep
    assert dict(facts.top)[".git"] is None
    assert not facts.truncated
    plan = pr.plan([facts], frozenset())
    dests = {b.dest for b in pr.bind_pairs(plan, [(str(tmp_path), str(tmp_path))])}
    assert os.fsdecode(odd + b"/.git") in dests


def test_scan_reads_a_git_file_and_its_commondir(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "worktrees" / "wt").mkdir(parents=True)
    (store / "worktrees" / "wt" / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text("gitdir: ../store/worktrees/wt\n")
    facts = pr.scan_tree(str(tmp_path))
    (repo,) = facts.repos
    assert repo.gitdir == str(store / "worktrees" / "wt")
    assert repo.commondir == str(store)


def test_scan_does_not_block_on_a_fifo_named_git(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / ".git")
    facts = pr.scan_tree(str(tmp_path))
    assert dict(facts.top)[".git"] == "other"
    assert facts.repos == (RepoFact(str(tmp_path / ".git"), "other"),)


def test_scan_caps_depth_and_entries(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*[f"d{i}" for i in range(pr.MAX_DEPTH + 2)])
    deep.mkdir(parents=True)
    (deep / ".git").mkdir()
    facts = pr.scan_tree(str(tmp_path))
    assert facts.truncated and facts.repos == ()
    for i in range(30):
        (tmp_path / f"f{i}").touch()
    assert pr.scan_tree(str(tmp_path), max_entries=10).truncated


# -- placeholders -------------------------------------------------------------------


def _placeholder_plan(ws: Path) -> ProtectPlan:
    return ProtectPlan(
        (Guard(str(ws / ".vscode"), "dir", "listed"), Guard(str(ws / ".envrc"), "file", "listed")),
        (),
    )


def _records(where: Path) -> list[str]:
    return sorted(n for n in os.listdir(where) if n.endswith(".json"))


def test_placeholders_created_then_removed(tmp_path: Path) -> None:
    ws, records = tmp_path / "ws", tmp_path / "rec"
    ws.mkdir()
    ph = Placeholders(_placeholder_plan(ws), str(records))
    ph.create()
    assert (ws / ".vscode").is_dir() and (ws / ".envrc").is_file()
    (name,) = _records(records)
    doc = json.loads((records / name).read_text())
    assert {r["path"] for r in doc["made"]} == {str(ws / ".vscode"), str(ws / ".envrc")}
    assert all("ino" in r for r in doc["made"])
    ph.release()
    assert os.listdir(ws) == [] and _records(records) == []


def _live_record(records: Path, uses: list[Path]) -> Path:
    """A record of a live corral (this test's parent) that binds `uses`."""
    path = records / f"exec-{os.getppid()}-11111111.json"
    pairs = [[os.lstat(u).st_dev, os.lstat(u).st_ino] for u in uses]
    path.write_text(json.dumps({"made": [], "uses": pairs}))
    return path


def test_placeholder_another_sandbox_binds_outlives_its_creator(tmp_path: Path) -> None:
    # Unlinking it would detach the other sandbox's read-only mount (a
    # mountpoint in another mount namespace can be unlinked), letting that
    # sandbox create the name.
    ws, records = tmp_path / "ws", tmp_path / "rec"
    ws.mkdir()
    ph = Placeholders(_placeholder_plan(ws), str(records))
    ph.create()
    other = _live_record(records, [ws / ".envrc"])
    ph.release()
    assert (ws / ".envrc").exists() and not (ws / ".vscode").exists()
    assert [n for n in _records(records) if n.startswith("left-")]
    other.unlink()  # the other sandbox ended
    assert pr.sweep_stale(str(records)) == [str(ws / ".envrc")]
    assert os.listdir(ws) == [] and _records(records) == []


def test_a_second_sandbox_records_the_placeholders_it_reuses(tmp_path: Path) -> None:
    ws, records = tmp_path / "ws", tmp_path / "rec"
    ws.mkdir()
    first = Placeholders(_placeholder_plan(ws), str(records))
    first.create()
    reuse = ProtectPlan(
        (Guard(str(ws / ".vscode"), None, "listed"), Guard(str(ws / ".envrc"), None, "listed")), ()
    )
    second = Placeholders(reuse, str(records))
    second.create()
    first.release()
    assert (ws / ".vscode").is_dir() and (ws / ".envrc").is_file()
    second.release()  # the last user sweeps the first one's leftovers
    assert os.listdir(ws) == [] and _records(records) == []


def test_placeholder_that_gained_content_is_left_alone(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    ph = Placeholders(_placeholder_plan(ws), str(tmp_path / "rec"))
    ph.create()
    (ws / ".envrc").write_text("the user's own\n")
    (ws / ".vscode" / "settings.json").write_text("{}")
    ph.release()
    assert (ws / ".envrc").read_text() == "the user's own\n"
    assert (ws / ".vscode" / "settings.json").exists()


def test_placeholder_creation_failure_fails_closed_and_cleans_up(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    plan = ProtectPlan(
        (
            Guard(str(ws / ".vscode"), "dir", "listed"),
            Guard(str(ws / "missing" / ".envrc"), "file", "listed"),
        ),
        (),
    )
    with pytest.raises(SandboxStartError, match="placeholder"):
        Placeholders(plan, str(tmp_path / "rec")).create()
    assert os.listdir(ws) == []


def test_sweep_removes_records_of_dead_owners_only(tmp_path: Path) -> None:
    ws, records = tmp_path / "ws", tmp_path / "rec"
    ws.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    ph = Placeholders(_placeholder_plan(ws), str(records))
    ph.create()
    (mine,) = _records(records)
    os.rename(records / mine, records / f"exec-{int(dead.stdout)}-00000000.json")
    (ws / ".claude").mkdir()
    alive = records / f"exec-{os.getppid()}-22222222.json"
    alive.write_text(json.dumps({"made": [{"path": str(ws / ".claude"), "kind": "dir"}]}))
    removed = pr.sweep_stale(str(records))
    assert sorted(removed) == sorted([str(ws / ".vscode"), str(ws / ".envrc")])
    assert os.listdir(ws) == [".claude"]
    assert _records(records) == [alive.name]


def test_created_below_lists_only_new_unguarded_names() -> None:
    before = _facts(repos=(RepoFact("/w/old/.git", "dir"),), deep=(("/w/old/.envrc", "file"),))
    plan = pr.plan([before], frozenset({".idea"}))
    after = _facts(
        repos=(RepoFact("/w/old/.git", "dir"), RepoFact("/w/new/.git", "dir")),
        deep=(
            ("/w/old/.envrc", "file"),
            ("/w/new/.envrc", "file"),
            ("/w/new/.idea", "dir"),  # unprotected by request: not reported
            ("/w/.vscode/x/.envrc", "file"),  # inside a read-only guard: not created by it
        ),
    )
    assert pr.created_below(plan, [after]) == ("/w/new/.envrc", "/w/new/.git")


def test_show_escapes_terminal_controls_and_raw_bytes() -> None:
    hostile = os.fsdecode(b"/w/a\x1b]0;t\x07\nb\xff/caf\xc3\xa9")
    assert pr.show(hostile) == "/w/a\\x1b]0;t\\x07\\nb\\xff/café"


def test_refusal_message_escapes_the_name() -> None:
    name = os.fsdecode(b"/w/x\x1b[2J")
    with pytest.raises(LayerUnavailableError) as exc:
        pr.plan([_facts(deep=((name + "/.envrc", "symlink"),))], frozenset())
    assert "\x1b" not in str(exc.value) and "\\x1b[2J" in str(exc.value)


def test_paths_under_a_read_only_user_bind_are_left_alone() -> None:
    # --ro /w/data: binding a pin (writable) there would make it writable again.
    facts = _facts(
        repos=(RepoFact("/w/data/x/.git", "dir"), RepoFact("/w/data/y/.git", "symlink")),
        deep=(("/w/data/.envrc", "file"),),
    )
    plan = pr.plan([facts], frozenset(), readonly=["/w/data"])
    assert not any(g.path.startswith("/w/data/") for g in plan.guards)
    assert plan.pins == ()
    # a writable tree inside the read-only one is protected again
    inner = _facts("/w/data/rw", repos=(RepoFact("/w/data/rw/k/.git", "dir"),))
    plan = pr.plan([facts, inner], frozenset(), readonly=["/w/data"])
    assert "/w/data/rw/k/.git" in _by_path(plan) and plan.pins == ("/w/data/rw/k",)


def test_unusable_record_directory_fails_closed(tmp_path: Path) -> None:
    from corral.sandbox.spec import SandboxSpec

    ws = tmp_path / "ws"
    ws.mkdir()
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    spec = SandboxSpec(argv=("true",), workspace=str(ws), env=(), protect=True)
    with pytest.raises(SandboxStartError, match="protect"):
        pr.start_protection(spec, [StagedBind(str(ws), str(ws), True)], str(cache))
    assert os.listdir(ws) == []


def _lock_is_free(cache: Path) -> bool:
    import fcntl

    fd = os.open(cache / "placeholders" / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_deferred_plan_holds_the_records_lock_until_its_placeholders_exist(
    tmp_path: Path,
) -> None:
    """`defer=True`: planned and recorded nothing yet, lock held (no other start or
    teardown can change what the plan saw); `finish()` makes them, then lets go."""
    from corral.sandbox.spec import SandboxSpec

    ws = tmp_path / "ws"
    ws.mkdir()
    cache = tmp_path / "cache"
    spec = SandboxSpec(argv=("true",), workspace=str(ws), env=(), protect=True)
    binds, ph = pr.start_protection(
        spec, [StagedBind(str(ws), str(ws), True)], str(cache), defer=True
    )
    assert ph.deferred and binds
    assert os.listdir(ws) == [] and not _lock_is_free(cache)
    ph.finish()
    assert not ph.deferred and _lock_is_free(cache)
    assert set(os.listdir(ws)) == set(pr.PROTECTED_NAMES)
    ph.release()
    assert os.listdir(ws) == []


def test_a_deferred_plan_released_unfinished_makes_nothing_and_frees_the_lock(
    tmp_path: Path,
) -> None:
    from corral.sandbox.spec import SandboxSpec

    ws = tmp_path / "ws"
    ws.mkdir()
    cache = tmp_path / "cache"
    spec = SandboxSpec(argv=("true",), workspace=str(ws), env=(), protect=True)
    _, ph = pr.start_protection(spec, [StagedBind(str(ws), str(ws), True)], str(cache), defer=True)
    ph.release()
    assert _lock_is_free(cache) and os.listdir(ws) == []
    assert [n for n in os.listdir(cache / "placeholders") if n.endswith(".json")] == []


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (b"[core]\n\thooksPath = .husky/_\n", ".husky/_"),
        (b"[CORE]\n  HOOKSPATH=.githooks ; comment\n", ".githooks"),
        (b'[core]\n\thookspath = "dir with # hash"\n', "dir with # hash"),
        (b"[core] hooksPath = a\n[core]\nhooksPath = b\n", "b"),
        (b"[user]\n\thooksPath = x\n[core]\n\tbare = false\n", None),
        (b"", None),
    ],
)
def test_hooks_path_of(config: bytes, expected: str | None) -> None:
    assert pr.hooks_path_of(config) == expected


def test_scan_follows_core_hooks_path(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n\thooksPath = .husky/_\n")
    (tmp_path / ".husky" / "_").mkdir(parents=True)
    (sub := tmp_path / "sub" / ".git").mkdir(parents=True)
    (sub / "config").write_text("[core]\n\thooksPath = hooks/here\n")
    facts = pr.scan_tree(str(tmp_path))
    hooks = {r.path: r.hooks for r in facts.repos}
    # husky runs the scripts in .husky, not only in .husky/_
    assert hooks[str(tmp_path / ".git")] == (str(tmp_path / ".husky"), "dir")
    # a missing hooks directory is held at its first missing component
    assert hooks[str(sub)] == (str(tmp_path / "sub" / "hooks"), None)
    guards = _by_path(pr.plan([facts], frozenset()))
    assert guards[str(tmp_path / ".husky")].create is None
    assert guards[str(tmp_path / "sub" / "hooks")].create == "dir"
    assert str(tmp_path / "sub" / "hooks") not in _by_path(pr.plan([facts], frozenset({".git"})))


def test_hooks_path_at_the_tree_top_is_refused() -> None:
    facts = _facts(repos=(RepoFact("/w/.git", "dir", hooks=("/w", "dir")),))
    with pytest.raises(LayerUnavailableError, match="hooksPath"):
        pr.plan([facts], frozenset())


def test_dry_run_quoting_is_exact_and_sends_no_control_bytes() -> None:
    from corral.exec.cli import quote_argv

    hostile = os.fsdecode(b"/w/x\x1b]0;t\x07\xff/caf\xc3\xa9 'q'/.git")
    line = quote_argv(["bwrap", "--ro-bind", hostile, "plain path"])
    assert all(c.isprintable() for c in line)
    echoed = subprocess.run(
        ["bash", "-c", f'for a in {line}; do printf "%s\\0" "$a"; done'],
        capture_output=True,
        check=True,
    ).stdout
    assert echoed.split(b"\0")[:-1] == [b"bwrap", b"--ro-bind", os.fsencode(hostile), b"plain path"]


def test_record_temp_files_of_killed_writers_are_swept(tmp_path: Path) -> None:
    """A corral killed between writing a record's temporary file and renaming
    it leaves the file; the next sweep (under the records' lock, which every
    writer holds) removes it instead of keeping it forever."""
    where = tmp_path / "placeholders"
    where.mkdir()
    orphans = [where / f"exec-{os.getpid()}-00ff00ff.json.tmp", where / "left-0a0b0c.json.tmp"]
    for orphan in orphans:
        orphan.write_text('{"made": [')
    live = where / f"exec-{os.getpid()}-11223344.json"
    live.write_text(json.dumps({"made": [], "uses": []}))
    pr.sweep_stale(str(where))
    assert not any(o.exists() for o in orphans)
    assert live.exists()


def test_bind_sources_follow_the_staged_tree() -> None:
    p = pr.plan([_facts("/ws", top={".git": "dir"})], frozenset())
    got = {b.dest: b.source for b in pr.bind_pairs(p, [("/ws", "/run/corral-stage/0")])}
    assert got["/ws/.git"] == "/run/corral-stage/0/.git"
    assert got["/ws/.envrc"] == "/run/corral-stage/0/.envrc"
    deep = pr.plan([_facts("/ws", deep=(("/ws/a/b/.envrc", "file"),))], frozenset())
    got = {b.dest: b.source for b in pr.bind_pairs(deep, [("/ws", "/s/0")])}
    assert got["/ws/a/b/.envrc"] == "/s/0/a/b/.envrc"
    assert got["/ws/a"] == "/s/0/a"
    assert got["/ws/a/b"] == "/s/0/a/b"
