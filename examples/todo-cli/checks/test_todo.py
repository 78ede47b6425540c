"""Acceptance checks for examples/todo-cli (run by corral's verifier, outside the workspace)."""

import os
import subprocess
import sys
import tempfile


def todo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "todo.py", *args], capture_output=True, text=True, env=env, timeout=10
    )


def main() -> int:
    which = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TODO_FILE=os.path.join(tmp, "todo.json"))
        first = todo("add", "buy milk", env=env)
        second = todo("add", "write report", env=env)
        if first.returncode or second.returncode:
            print("add failed:", first.stderr, second.stderr)
            return 1
        if which == "add_list":
            out = todo("list", env=env).stdout.splitlines()
            if out != ["1 [ ] buy milk", "2 [ ] write report"]:
                print("unexpected list output:", out)
                return 1
            return 0
        done = todo("done", "2", env=env)
        out = todo("list", env=env).stdout.splitlines()
        if done.returncode != 0 or out != ["1 [ ] buy milk", "2 [x] write report"]:
            print("after `done 2`, list printed:", out)
            return 1
        if todo("done", "9", env=env).returncode != 1:
            print("`done 9` should exit 1")
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
