"""The sentry's fork-family log: which lines are refusals at the pids limit."""

from __future__ import annotations

import os

from corral.sandbox.gvisor.bundle import runsc_argv
from corral.sandbox.gvisor.nproc import STRACE_FLAGS, SentryRefusals, count_refusals

# As runsc 20221219's sentry writes them (--strace, clone only).
_ARGS = b"clone(CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|0x11, 0x0, 0x0, 0x7f7fc9c85310, 0x0)"
_HEAD = b"I1201 13:36:59.904755       9 strace.go:611] [   3:   3] "
ENTRY = _HEAD + b"python3 E " + _ARGS
OK = _HEAD + b"python3 X " + _ARGS + b" = 10 (0xa) (8.781569ms)"
REFUSED = _HEAD + b"python3 X " + _ARGS + b" = 0 (0x0) errno=11 (try again) (1.020899ms)"


def test_only_a_returned_eagain_counts() -> None:
    assert count_refusals([ENTRY, OK, REFUSED, REFUSED.replace(b"clone", b"vfork")]) == 2
    other = REFUSED.replace(b"errno=11 (try again)", b"errno=12 (cannot allocate memory)")
    assert count_refusals([other, b"", b"I1201 starting sandbox"]) == 0


def test_a_task_name_with_newlines_cannot_hide_a_refusal() -> None:
    # PR_SET_NAME allows 15 bytes, newlines included: the line splits, and the
    # sentry's own text after the name still names the refusal.
    hostile = (_HEAD + b"a\nb\n X clone( X " + _ARGS + b" = 0 (0x0) errno=11 (try again)").split(
        b"\n"
    )
    assert count_refusals(hostile) == 1
    # ...nor forge one when the sentry reported success.
    forged = (_HEAD + b"a\nb\n X clone( X " + _ARGS + b" = 10 (0xa) (1ms)").split(b"\n")
    assert count_refusals(forged) == 0


def test_refusals_are_counted_from_the_pipe_until_its_writers_are_gone() -> None:
    r = SentryRefusals()
    try:
        assert r.write_fd >= 10
        writer = os.dup(r.write_fd)
        r.started()
        # Split across writes, as a pipe delivers them.
        data = b"\n".join([OK, REFUSED, ENTRY, REFUSED]) + b"\n"
        os.write(writer, data[:50])
        os.write(writer, data[50:])
        os.close(writer)
        assert r.count(5.0) == 2
    finally:
        r.close()


def test_flags_go_before_run() -> None:
    r = SentryRefusals()
    fd = r.write_fd
    try:
        argv = runsc_argv(
            runsc="runsc",
            platform="ptrace",
            state_dir="/s",
            bundle_dir="/b",
            container_id="c",
            extra_flags=tuple(r.argv_flags()),
        )
    finally:
        r.close()
    run = argv.index("run")
    assert set(STRACE_FLAGS) <= set(argv[:run])
    assert f"--debug-log=/proc/self/fd/{fd}" in argv[:run]
