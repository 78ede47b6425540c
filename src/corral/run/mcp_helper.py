"""The MCP gateway of a session in its own helper, inside the run's `helpers-mcp` cgroup.

The gateway parses agent-controlled JSON-RPC (up to 4 MiB a request, many
at once) and holds the SDK's state: in the coordinator that memory was
charged to no run. Here it is a `helper_main mcp` process, joined before its
interpreter starts (run/helpers.py), whose MCP servers are its own children
(their `corral exec` prelude names this process as the parent to follow).

    gateway = McpHelper.start(policy, identity, scratch=..., journal_path=...,
                              run_id=..., cgroup_procs=..., log=...)
    gateway.url          # what the broker's `mcp` route points at
    gateway.dead()       # HelperError once the helper is gone
    gateway.close()

The helper writes its `mcp_call` rows through the Journal API itself, as the
in-process gateway did: each call is committed before it is forwarded. It
says `ready URL` once every server answered, or exits non-zero (the reason in
its log), which `start()` turns into AgentError.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import AgentError, HelperError
from corral.pauseclock import Clock
from corral.run.helpers import Helper

if TYPE_CHECKING:
    from corral.broker.actions import Identity
    from corral.broker.mcp_policy import McpPolicy

__all__ = ["McpHelper", "serve_gateway"]

_URL = re.compile(r"^http://127\.0\.0\.1:[0-9]{1,5}$")


class McpHelper:
    """A session's MCP gateway running in the `mcp` helper."""

    def __init__(self, helper: Helper, url: str) -> None:
        self._helper = helper
        self.url = url

    @property
    def pid(self) -> int:
        return self._helper.proc.pid

    @classmethod
    def start(
        cls,
        policy: McpPolicy,
        identity: Identity,
        *,
        scratch: Path,
        journal_path: Path,
        run_id: str,
        cgroup_procs: Sequence[str],
        log: Path,
        timeout_s: float = 60.0,
        clock: Clock = time.monotonic,
        pauses: Path | None = None,
    ) -> McpHelper:
        """The gateway, ready; AgentError when it or a server did not start
        (HelperError, an AgentError's sibling, when it could not join the run).

        `clock` times the wait here; `pauses` (the run's published pauses)
        times the gateway's own wait for its servers, in the helper."""
        config = scratch / "gateway.json"
        config.write_text(
            json.dumps(
                {
                    "policy": policy.model_dump(mode="json"),
                    "identity": identity.model_dump(mode="json"),
                    "scratch": str(scratch),
                    "journal": str(journal_path),
                    "run": run_id,
                    "pauses": None if pauses is None else str(pauses),
                }
            ),
            encoding="utf-8",
        )
        config.chmod(0o600)
        helper = Helper.spawn("mcp", (str(config),), cgroup_procs, log, clock=clock)
        try:
            line = helper.read_line(timeout_s)
        except HelperError as exc:
            helper.close(1.0)
            if "layer run cgroup" in str(exc):
                raise
            raise AgentError(f"the MCP gateway failed to start: {exc}") from exc
        url = line.removeprefix("ready ")
        if not line.startswith("ready ") or not _URL.match(url):
            helper.close(1.0)
            raise AgentError(f"the MCP gateway did not report a loopback URL: {line[:80]!r}")
        return cls(helper, url)

    def dead(self) -> HelperError | None:
        code = self._helper.poll()
        return None if code is None else self._helper.failure(code)

    def close(self) -> None:
        # Closing stdin lets the gateway end its servers' sandboxes (SIGTERM
        # teardown) before it exits; SIGKILL only past the grace.
        self._helper.close(20.0)


def serve_gateway(config_path: str) -> int:
    """Helper side: run the gateway until stdin closes."""
    from corral.broker.actions import Identity
    from corral.broker.journal import Journal
    from corral.broker.mcp_gateway import McpGateway
    from corral.broker.mcp_policy import McpPolicy
    from corral.pauseclock import PausableClock
    from corral.run.pause import file_paused_s
    from corral.run.session import mcp_launcher

    doc = json.loads(Path(config_path).read_text(encoding="utf-8"))
    policy = McpPolicy.model_validate(doc["policy"])
    identity = Identity.model_validate(doc["identity"])
    with Journal(doc["journal"]) as journal:
        gateway = McpGateway(
            policy,
            journal,
            identity,
            scratch=Path(doc["scratch"]),
            sandbox=True,
            # The servers' prelude follows this process: they end with it.
            corral=mcp_launcher(doc["run"]),
            journal_path=doc["journal"],
        )
        # Frozen with the run, its own clock runs on: the published pauses stop it.
        pauses = doc.get("pauses")
        clock = PausableClock(file_paused_s(Path(pauses))) if pauses else time.monotonic
        try:
            url = gateway.start(timeout=60.0, clock=clock)
        except AgentError as exc:
            sys.stderr.write(f"corral mcp helper: {exc}\n")
            gateway.close()
            return 1
        try:
            sys.stdout.write(f"ready {url}\n")
            sys.stdout.flush()
            while sys.stdin.buffer.read(512):
                pass
        finally:
            gateway.close()
    return 0
