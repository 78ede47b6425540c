"""Markers probed from this machine, defined once for the whole suite.

A test that needs a host feature carries `requires_<feature>`; when the probe
fails the test is skipped with the reason. With CORRAL_REQUIRE_ALL=1 (set by
CI) such a skip is turned into a failure, so a guarantee is never silently
untested on the CI machine.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator

import pytest
from hypothesis import settings

from corral import doctor as probe

# Hypothesis' per-example deadline is a wall-clock oracle: on a loaded 2-core
# host a first example (imports, caches) takes longer than 200 ms and fails
# the test for a reason that has nothing to do with the property.
settings.register_profile("corral", deadline=None)
settings.load_profile("corral")


@functools.cache
def _root() -> str | None:
    return None if os.geteuid() == 0 else "needs root"


@functools.cache
def _bwrap() -> str | None:
    r = probe.probe_bwrap()
    return None if r.available else r.reason


@functools.cache
def _cgroup() -> str | None:
    r = probe.probe_cgroup()
    return None if r.available else r.reason


@functools.cache
def _landlock() -> str | None:
    r = probe.probe_landlock()
    return None if r.available else r.reason


@functools.cache
def _seccomp() -> str | None:
    r = probe.probe_seccomp()
    return None if r.available else r.reason


@functools.cache
def _userns() -> str | None:
    r = probe.probe_userns()
    return None if r.available else r.reason


@functools.cache
def _kvm() -> str | None:
    return None if os.access("/dev/kvm", os.R_OK | os.W_OK) else "/dev/kvm not usable"


@functools.cache
def _npm() -> str | None:
    return None if shutil.which("npm") else "npm not installed"


@functools.cache
def _curl() -> str | None:
    return None if shutil.which("curl") else "curl not installed"


@functools.cache
def _unix() -> str | None:
    r = probe.probe_unix()
    return None if r.available else r.reason


@functools.cache
def _runsc() -> str | None:
    return None if shutil.which("runsc") else "runsc (gVisor) not installed"


@functools.cache
def _qemu() -> str | None:
    r = probe.probe_qemu()
    return None if r.available else r.reason


def _sandbox() -> str | None:
    return _root() or _bwrap() or _userns() or _cgroup() or _seccomp() or _landlock() or _unix()


PROBES: dict[str, tuple[str, Callable[[], str | None]]] = {
    "requires_root": ("the test runs as root", _root),
    "requires_bwrap": ("bubblewrap is installed and works", _bwrap),
    "requires_cgroup": ("a writable cgroup hierarchy", _cgroup),
    "requires_landlock": ("Landlock is available", _landlock),
    "requires_seccomp": ("libseccomp is usable", _seccomp),
    "requires_userns": ("unprivileged user namespaces work", _userns),
    "requires_kvm": ("/dev/kvm is usable", _kvm),
    "requires_npm": ("npm is installed", _npm),
    "requires_curl": ("curl is installed", _curl),
    "requires_sandbox": ("the full namespace sandbox profile can run", _sandbox),
    "requires_runsc": ("runsc (gVisor) is installed", _runsc),
    "requires_qemu": ("QEMU and the microvm guest kernel are installed", _qemu),
}


def pytest_configure(config: pytest.Config) -> None:
    for name, (doc, _) in PROBES.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def pytest_runtest_setup(item: pytest.Item) -> None:
    strict = os.environ.get("CORRAL_REQUIRE_ALL") == "1"
    for name, (_, check) in PROBES.items():
        if item.get_closest_marker(name) is None:
            continue
        reason = check()
        if reason is None:
            continue
        if strict:
            pytest.fail(f"{name}: {reason} (CORRAL_REQUIRE_ALL=1 forbids skipping)")
        pytest.skip(f"{name}: {reason}")


@pytest.fixture
def run_cmd() -> Callable[..., subprocess.CompletedProcess[str]]:
    def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, check=False
        )

    return _run


def _chromium() -> str | None:
    if shutil.which("chromium") is None:
        return "Debian's chromium is not installed"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright (Python) is not installed"
    return None


PROBES["requires_chromium"] = ("chromium and Playwright (Python) are installed", _chromium)


# -- PostgreSQL (the shared run store, corral.store.postgres) ----------------
PG_BIN = "/usr/lib/postgresql/15/bin"


@functools.cache
def _postgresql() -> str | None:
    if not os.path.exists(f"{PG_BIN}/postgres") or not os.path.exists(f"{PG_BIN}/initdb"):
        return f"PostgreSQL server binaries not in {PG_BIN}"
    if os.geteuid() == 0 and not shutil.which("runuser"):
        return "postgres refuses root and runuser is missing"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg not installed"
    return None


PROBES["requires_postgresql"] = ("a PostgreSQL server can be started by the test", _postgresql)


# --- requires_audit (issue 15, kernel denials) --------------------------------
@functools.cache
def _audit() -> str | None:
    # Audit may be off (corral never turns it on; tests do, for their
    # duration): what the marker needs is that the flag can be read and set.
    return None if probe.kernel_audit_enabled() is not None else "kernel audit cannot be queried"


PROBES["requires_audit"] = ("kernel audit can be queried and switched (CAP_AUDIT_CONTROL)", _audit)


# --- requires_strace (issue 13, kill -9 at counted system calls) --------------
def _strace() -> str | None:
    return None if shutil.which("strace") else "strace not installed"


PROBES["requires_strace"] = ("strace is installed (fault injection by syscall count)", _strace)


# --- host devices every process shares stay as they were ------------------------
#: runsc fchowns the descriptors it gets as a container's stdio (a host
#: /dev/null handed to it came back owned by nobody, then re-moded from inside);
#: every test is checked, so the one that changes a shared device fails by
#: name instead of the tests that later cannot open it.
_SHARED_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom")


def _device_ids() -> dict[str, tuple[int, int, int]]:
    out: dict[str, tuple[int, int, int]] = {}
    for dev in _SHARED_DEVICES:
        with contextlib.suppress(OSError):
            st = os.stat(dev)
            out[dev] = (st.st_uid, st.st_gid, st.st_mode)
    return out


@pytest.fixture(autouse=True)
def _shared_devices_untouched() -> Iterator[None]:
    before = _device_ids()
    yield
    after = _device_ids()
    changed = {d: (before[d], after.get(d)) for d in before if after.get(d) != before[d]}
    if not changed:
        return
    if os.geteuid() == 0:
        for dev, ((uid, gid, mode), _) in changed.items():
            with contextlib.suppress(OSError):
                os.chown(dev, uid, gid)
                os.chmod(dev, stat.S_IMODE(mode))
    pytest.fail(f"the test changed host devices (uid, gid, mode) before -> after: {changed}")
