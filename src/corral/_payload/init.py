"""The sandbox's init: runs inside the sandbox, before the user's command.

Started by bubblewrap as `/usr/bin/python3 -I -S /run/corral/init.py
STATUS_FD LANDLOCK_JSON|- [--hold FD] -- ARGV...`; standard library only (no
site-packages exist in there) and as few imports as possible (not even
`json`: each import is paid on every sandbox's start-up). It keeps init.c's
contract:

0. makes itself non-dumpable, so the command (same uid, no capabilities)
   can neither write its memory through /proc/<init>/mem nor reopen its
   descriptors through /proc/<init>/fd;
1. applies Landlock (rules from CONFIG), failing closed: if Landlock was
   required and cannot be applied, the command never runs (exit 125);
2. resolves the command on the sandbox's PATH (127 when not found, like sh);
3. forks; the child enters a nested Landlock domain, out of which neither
   ptrace-mode access nor (ABI >= 6) signals reach the init; it execs the
   command while the init forwards SIGTERM/SIGINT/SIGHUP to it;
4. when the command exits, reports `{"event": "exit", ...}` as one JSON line
   on the status fd, waits (with --hold) until the host closes FD, so that
   the leftovers are still in place while the host counts them, then exits
   with the command's status; bwrap's monitor reports that status to the
   host from outside the sandbox;
5. when the host's end of --hold closes, kills every process it can signal,
   before the command's end too (corral is gone: init.c's end_all says why).
"""

import os
import signal
import sys

EXIT_REFUSED = 125
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
_PR_SET_DUMPABLE = 4


def _jvalue(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    out = []
    for ch in text:
        if ch in '"\\' or ord(ch) < 0x20 or ord(ch) > 0x7E:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else "?")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _report(fd: int, event: dict[str, object]) -> None:
    """Write one JSON object as a line on the status fd (hand-encoded: ASCII, flat)."""
    if fd < 0:
        return
    body = ", ".join(f"{_jvalue(k)}: {_jvalue(v)}" for k, v in event.items())
    data = ("{" + body + "}\n").encode()
    try:
        os.write(fd, data)
    except OSError:
        pass


def _end_all() -> None:
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass


def _which(cmd: str, path: str) -> str | None:
    if "/" in cmd:
        return cmd if os.path.exists(cmd) else None
    for d in path.split(":"):
        cand = os.path.join(d or ".", cmd)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _set_undumpable() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def main(argv: list[str]) -> int:
    hold_fd = -1
    if len(argv) >= 4 and argv[2] == "--hold":
        hold_fd = int(argv[3])
        argv = argv[:2] + argv[4:]
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write(
            "corral-init: usage: init.py STATUS_FD LANDLOCK_JSON|- [--hold FD] -- ARGV...\n"
        )
        return EXIT_REFUSED
    status_fd = int(argv[0])
    rules = None if argv[1] == "-" else argv[1]
    cmd = argv[3:]
    if status_fd >= 0:
        # The user's command must not inherit the channel to the host.
        os.set_inheritable(status_fd, False)
    if hold_fd >= 0:
        os.set_inheritable(hold_fd, False)
    try:
        # While dumpable, a process of the same uid may write this one's
        # memory through /proc/<pid>/mem (FOLL_FORCE ignores page protections).
        _set_undumpable()
    except OSError as exc:
        msg = f"corral-init: {exc}"
        _report(
            status_fd, {"event": "error", "layer": "init", "code": EXIT_REFUSED, "message": msg}
        )
        sys.stderr.write(f"corral: {msg}\n")
        return EXIT_REFUSED

    if rules is not None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        try:
            import landlock  # type: ignore[import-not-found]  # loaded from INIT_DIR

            ll_rules = landlock.LandlockRules.from_json(rules)
            abi = landlock.apply(ll_rules)
        except Exception as exc:  # fail closed on any error
            msg = f"Landlock could not be applied: {exc}"
            _report(
                status_fd,
                {"event": "error", "layer": "landlock", "code": EXIT_REFUSED, "message": msg},
            )
            sys.stderr.write(f"corral: {msg}\n")
            return EXIT_REFUSED
        _report(status_fd, {"event": "landlock", "abi": abi})

    path = _which(cmd[0], os.environ.get("PATH", "/usr/bin:/bin"))
    if path is None:
        msg = f"{cmd[0]}: command not found in the sandbox"
        _report(status_fd, {"event": "error", "code": EXIT_NOT_FOUND, "message": msg})
        sys.stderr.write(f"corral: {msg}\n")
        return EXIT_NOT_FOUND

    # Block the forwarded signals before fork so none is lost in between.
    fwd = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    signal.pthread_sigmask(signal.SIG_BLOCK, fwd)
    pid = os.fork()
    if pid == 0:
        if rules is not None:
            try:
                landlock.nest(ll_rules)
            except Exception as exc:  # fail closed
                msg = f"Landlock could not be applied: nested domain: {exc}"
                _report(
                    status_fd,
                    {"event": "error", "layer": "landlock", "code": EXIT_REFUSED, "message": msg},
                )
                sys.stderr.write(f"corral: {msg}\n")
                os._exit(EXIT_REFUSED)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, fwd)
        try:
            os.execv(path, cmd)
        except OSError as exc:
            sys.stderr.write(f"corral: {cmd[0]}: {exc.strerror}\n")
            os._exit(EXIT_NOT_EXECUTABLE if exc.errno in (13, 8) else EXIT_NOT_FOUND)
    _report(status_fd, {"event": "started", "pid": pid})

    reaped = False

    def forward(signum: int, _frame: object) -> None:
        if reaped:  # its pid may be reused by a leftover
            return
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in fwd:
        signal.signal(s, forward)
    # SIGCHLD and the host's EOF on --hold both wake the wait (init.c's end_all).
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, fwd)
    import select

    watch = hold_fd >= 0
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            status = 0
            break
        if done == pid:
            break
        try:
            ready, _, _ = select.select([wake_r, hold_fd] if watch else [wake_r], [], [])
        except OSError:
            # Cannot watch --hold: wait as before rather than die or spin.
            watch = False
            continue
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        if watch and hold_fd in ready:
            watch = False
            _end_all()
    reaped = True
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code = 128 + sig
    else:
        sig = 0
        code = os.WEXITSTATUS(status)
    _report(status_fd, {"event": "exit", "code": code, "signal": sig})
    if hold_fd >= 0:
        while True:
            try:
                os.read(hold_fd, 1)  # a byte or EOF releases
                break
            except InterruptedError:
                continue
            except OSError:
                break
        _end_all()
    return code


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
