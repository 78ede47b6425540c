"""The three environments of a run as `SandboxSpec`s, and the agent's broker policy (pure).

- agent: the workspace read-write; egress only through its broker, which
  admits the provider route and the mission's allowlist;
- product: a read-only snapshot of the session's commit and, with `data`, its
  persistent data directory (`corral.run.product`); no egress but its
  `[network.product]` allowlist and secret routes (`corral.run.envnet`); it
  listens on its own loopback and corral forwards its ports to the verifier;
- verifier: one sandbox per check; the snapshot and the checks read-only (the
  checks are a copy in the run directory, which no agent sandbox can see); no
  egress but `[network.verifier]` and its secret routes; the product is
  reached on the verifier's own 127.0.0.1:PORT through corral's forwarder.

The product's and the checks' stdout and stderr go to files in a directory
that sandbox alone may write (`sh -c 'exec >OUT 2>ERR'`): the namespace
backend lets the sandbox inherit corral's own descriptors otherwise. The
agent's go through pipes corral reads (`corral.run.capture`) into
`sessions/session-N/agent.stdout.log` and `agent.stderr.log`, which no
sandbox can see: the host parses the agent's result from there, and counts
its tokens in the broker (`corral.broker.metering`), never from a file the
agent could rewrite.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.agents.base import DEFAULT_HOME, HasSyntheticModel, Launch, LaunchRequest
from corral.agents.launch import launch_request
from corral.agents.routes import ProviderChoice, provider_route
from corral.broker.config import BrokerConfig, RouteConfig
from corral.broker.proxy_env import sandbox_proxy_env
from corral.broker.tcp import sandbox_env_for, sandbox_ssh_config
from corral.errors import ConfigError
from corral.run.checkspec import http_payload
from corral.run.envnet import env_network
from corral.run.mission import Check, Mission, ProviderRef, browser_in_checks
from corral.run.product import DATA_ENV, data_dir, product_env
from corral.sandbox.spec import (
    DEFAULT_PATH,
    SANDBOX_PROXY_PORT,
    Bind,
    Limits,
    NetworkSpec,
    SandboxSpec,
)

__all__ = [
    "CHECK_REASON",
    "HOME",
    "PROVIDER_ROUTE",
    "RunLayout",
    "agent_broker_config",
    "agent_request",
    "agent_spec",
    "base_env",
    "check_spec",
    "check_wall_s",
    "product_spec",
    "provider_base_url",
    "provider_choice",
    "redirect_argv",
]

HOME = DEFAULT_HOME
#: A check's reason line, written by `_payload/check_run.py` in its own scratch directory.
CHECK_REASON = "reason.txt"
PROVIDER_ROUTE = "provider"


@dataclass(frozen=True, slots=True)
class RunLayout:
    """Where everything of one run lives (all below `root`)."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def state(self) -> Path:
        return self.root / "state.sqlite"

    @property
    def journal(self) -> Path:
        return self.root / "journal.sqlite"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def git_dir(self) -> Path:
        return self.root / "git"

    @property
    def tools(self) -> Path:
        return self.root / "tools"

    @property
    def pauses(self) -> Path:
        """The run's pauses for code frozen with it (`corral.run.pause`): next to
        the check runner in `tools`, which every verifier sandbox binds read-only."""
        return self.tools / "pauses.json"

    @property
    def checks(self) -> Path:
        return self.root / "checks"

    @property
    def mission(self) -> Path:
        return self.root / "mission.md"

    @property
    def config(self) -> Path:
        return self.root / "run.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def transcripts(self) -> Path:
        return self.root / "transcripts"

    def snapshot(self, n: int) -> Path:
        return self.root / "snapshots" / f"session-{n}"

    def session_dir(self, n: int) -> Path:
        return self.root / "sessions" / f"session-{n}"

    def agent_stdout(self, n: int) -> Path:
        """Host-only: written by corral from the agent sandbox's stdout pipe."""
        return self.session_dir(n) / "agent.stdout.log"

    def agent_stderr(self, n: int) -> Path:
        return self.session_dir(n) / "agent.stderr.log"

    def mcp_dir(self, n: int) -> Path:
        """The MCP servers' directories of session `n` (`NAME/` each, writable by that
        server) and their logs. Outside the run directory: no part of a run but
        its workspace is ever handed to a sandbox."""
        return self.root.parent / ".mcp" / self.root.name / f"session-{n}"

    def product_dir(self, n: int, start: int = 1) -> Path:
        """The product's logs of its `start`-th start in session `n` (restarts: `product-K`)."""
        return self.session_dir(n) / ("product" if start == 1 else f"product-{start}")

    def check_dir(self, n: int, i: int) -> Path:
        return self.session_dir(n) / f"check-{i}"


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The allowlisted environment every sandboxed command starts from."""
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": HOME,
        "TMPDIR": "/tmp",
        "USER": "corral",
        "LOGNAME": "corral",
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if extra:
        env.update(extra)
    return env


def redirect_argv(argv: tuple[str, ...], out: Path, err: Path) -> tuple[str, ...]:
    """`argv` with stdin from /dev/null and stdout/stderr into files (inside the sandbox)."""
    script = 'exec <"/dev/null" >"$1" 2>"$2"; shift 2; exec "$@"'
    return ("/bin/sh", "-c", script, "corral-io", str(out), str(err), *argv)


def provider_base_url() -> str:
    """The provider as the agent sees it: the broker route on its own loopback."""
    return f"{sandbox_proxy_env()['CORRAL_BROKER_URL']}/routes/{PROVIDER_ROUTE}"


def provider_choice(provider: ProviderRef) -> ProviderChoice:
    """The mission's provider as `corral.agents` names it (routes, keys, wire checks)."""
    return ProviderChoice(provider.kind, provider.scenario, provider.url, provider.key)


def agent_request(
    agent: HasSyntheticModel,
    mission: Mission,
    provider: ProviderRef,
    *,
    prompt: str,
    executable: str,
    workspace: str,
) -> LaunchRequest:
    """What the agent's adapter launches in a session: `corral agent run`'s request.

    Built by `corral.agents.launch.launch_request`, so the mission's `model`,
    else the adapter's synthetic model for a synthetic provider, else the CLI's
    default; the provider at the broker route; its MCP servers are added by
    `corral.run.session` once their gateway is up.
    """
    return launch_request(
        agent,
        prompt,
        provider=provider_choice(provider),
        executable=executable,
        workspace=workspace,
        base_url=provider_base_url(),
        model=mission.settings.model,
        home=HOME,
        request_timeout_s=min(120.0, mission.settings.session.wall_time),
    )


def agent_broker_config(
    mission: Mission,
    provider: ProviderRef,
    synthetic_url: str | None,
    token_budget: int | None = None,
) -> BrokerConfig:
    """Rules from `[network].allow` plus the provider route (credentials injected).

    The route is `corral agent run`'s (`corral.agents.routes.provider_route`),
    under the name `provider`, with its token usage metered and, with a
    `token_budget` (what the session may still spend), refused once spent.
    UsageError when a synthetic provider has no URL.
    """
    base = BrokerConfig.from_allow_flags(mission.settings.network.allow)
    doc = provider_route(provider_choice(provider), synthetic_url)
    doc = {**doc, "meter_usage": True, "token_budget": token_budget}
    route = RouteConfig.model_validate(doc)
    network = mission.settings.network
    return base.model_copy(
        update={
            "rules": (*base.rules, *network.rules),
            "routes": {PROVIDER_ROUTE: route},
            "host_services": network.host_services,
            "tcp": network.tcp,
            "credentials": network.credentials,
            "upstream_tls": network.upstream_tls,
        }
    )


def _limits(mission: Mission, env: str, timeout_s: float | None) -> Limits:
    lim = getattr(mission.settings.limits, env)
    return Limits(memory_bytes=lim.memory, pids=lim.pids, cpus=lim.cpus, timeout_s=timeout_s)


def agent_spec(
    layout: RunLayout,
    *,
    mission: Mission,
    n: int,
    launch: Launch,
    broker_config: BrokerConfig,
    ro_paths: tuple[str, ...],
) -> SandboxSpec:
    """The agent sandbox of session `n`: only the workspace writable.

    Its stdio is the caller's (pipes, see `corral.run.capture`): nothing the
    host reads after the session lies under a mount the agent can write.
    """
    env = base_env({**sandbox_proxy_env(), **sandbox_env_for(broker_config, SANDBOX_PROXY_PORT)})
    binds = [Bind(p, writable=False) for p in ro_paths]
    product = mission.settings.product
    if product is not None and product.data and product.data_for_agent == "ro":
        env[DATA_ENV] = str(data_dir(layout))
        binds.append(Bind(env[DATA_ENV], writable=False))
    return SandboxSpec(
        argv=launch.wrapped_argv(),
        workspace=str(layout.workspace),
        env=tuple(sorted(env.items())),
        binds=tuple(binds),
        limits=_limits(mission, "agent", mission.settings.session.wall_time),
        network=NetworkSpec(
            allow=mission.settings.network.allow,
            broker_config=broker_config.to_json(),
            ssh_config=sandbox_ssh_config(broker_config, SANDBOX_PROXY_PORT),
        ),
        env_kind="agent",
        home=HOME,
        hostname="agent",
        run_id=layout.run_id,
        session_id=str(n),
    )


def product_spec(layout: RunLayout, mission: Mission, n: int, start: int = 1) -> SandboxSpec:
    """The product sandbox of session `n` (its `start`-th start): the snapshot
    read-only, the data directory (if any) writable, no egress."""
    product = mission.settings.product
    assert product is not None
    scratch = layout.product_dir(n, start)
    snap = layout.snapshot(n)
    script = f"cd {_q(str(snap))} && {product.command}"
    network, net_env = _env_network(mission, "product")
    env = base_env({**net_env, **product_env(product, layout, snap, start)})
    binds = [Bind(str(snap), writable=False)]
    if product.data:
        binds.append(Bind(str(data_dir(layout)), writable=True))
    return SandboxSpec(
        argv=redirect_argv(
            ("/bin/sh", "-c", script), scratch / "stdout.log", scratch / "stderr.log"
        ),
        workspace=str(scratch),
        env=tuple(sorted(env.items())),
        binds=tuple(binds),
        limits=_limits(mission, "product", None),
        network=network,
        env_kind="product",
        home=HOME,
        hostname="product",
        run_id=layout.run_id,
        session_id=str(n),
    )


def check_spec(
    layout: RunLayout,
    mission: Mission,
    *,
    n: int,
    i: int,
    check: Check,
    http_checker: Path,
    playwright_site: Path | None = None,
) -> SandboxSpec:
    """The verifier sandbox of check `i` of session `n`.

    A browser check runs `browser_check.py` (next to `http_checker`) over the
    mission's script as copied into the run's checks/ (never the workspace's),
    with `playwright_site` (the host's Playwright for Python) bound read-only.
    """
    scratch = layout.check_dir(n, i)
    snap = layout.snapshot(n)
    extra = {
        "CORRAL_SNAPSHOT": str(snap),
        "CORRAL_CHECKS": str(layout.checks),
        # Checks run with the agent's snapshot as their working directory:
        # without PYTHONSAFEPATH, `python3 -c/-m` would put it first on
        # sys.path and an agent-written json.py could change a check's verdict.
        # Helpers next to the checks stay importable through PYTHONPATH.
        "PYTHONSAFEPATH": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONPATH": str(layout.checks),
    }
    product = mission.settings.product
    binds = [Bind(str(snap), writable=False)]
    if product is not None:
        extra["PRODUCT_PORT"] = str(product.port)
        extra["PRODUCT_URL"] = f"http://127.0.0.1:{product.port}"
        extra["PRODUCT_PORTS"] = " ".join(str(p) for p in product.all_ports)
        if product.data:
            extra[DATA_ENV] = str(data_dir(layout))
            binds.append(Bind(str(data_dir(layout)), writable=False))
    if layout.checks.is_dir():
        binds.append(Bind(str(layout.checks), writable=False))
    runner = http_checker.parent / "check_run.py"
    binds.append(Bind(str(http_checker.parent), writable=False))
    if check.run is not None:
        main: tuple[str, ...] = ("/bin/sh", "-c", f"cd {_q(str(snap))} && {check.run}")
    elif check.browser is not None:
        cdir = mission.settings.checks_dir
        inner = browser_in_checks(check.browser, cdir) if cdir is not None else None
        if inner is None:
            raise ConfigError(f"check {check.name!r}: its browser script is not in checks_dir")
        if playwright_site is None:
            raise ConfigError(f"check {check.name!r}: browser checks need Playwright for Python")
        binds.append(Bind(str(playwright_site), writable=False))
        browser_doc = {
            "script": str(layout.checks / inner),
            "site": str(playwright_site),
            "timeout": max(1.0, check.timeout - 2.0),
        }
        main = (
            "/usr/bin/python3",
            "-I",
            str(http_checker.with_name("browser_check.py")),
            json.dumps(browser_doc),
        )
    else:
        assert product is not None
        doc = http_payload(check.http_steps(), product.port, check.timeout)
        main = ("/usr/bin/python3", "-I", str(http_checker), json.dumps(doc))
    run_doc = {
        "setup": check.setup and f"cd {_q(str(snap))} && {check.setup}",
        "teardown": check.teardown and f"cd {_q(str(snap))} && {check.teardown}",
        "main": list(main),
        "http": check.run is None and check.browser is None,
        "timeout": check.timeout,
        "reason": str(scratch / CHECK_REASON),
    }
    argv = ("/usr/bin/python3", "-I", str(runner), json.dumps(run_doc))
    network, net_env = _env_network(mission, "verifier")
    env = base_env({**check.env, **net_env, **extra})
    limits = _limits(mission, "verifier", check_wall_s(check))
    if check.memory is not None or check.pids is not None:
        limits = dataclasses.replace(
            limits,
            memory_bytes=check.memory or limits.memory_bytes,
            pids=check.pids or limits.pids,
        )
    return SandboxSpec(
        argv=redirect_argv(argv, scratch / "stdout.log", scratch / "stderr.log"),
        workspace=str(scratch),
        env=tuple(sorted(env.items())),
        binds=tuple(binds),
        limits=limits,
        network=network,
        env_kind="verifier",
        home=HOME,
        hostname="verifier",
        run_id=layout.run_id,
        session_id=str(n),
    )


def _env_network(
    mission: Mission, env: Literal["product", "verifier"]
) -> tuple[NetworkSpec, dict[str, str]]:
    own = getattr(mission.settings.network, env)
    return env_network(own.allow, mission.settings.secrets, env, own.host_services)


def check_wall_s(check: Check) -> float:
    """The verifier sandbox's wall-clock limit: each of setup, check, teardown gets `timeout`."""
    parts = 1 + (check.setup is not None) + (check.teardown is not None)
    return check.timeout * parts + 5.0


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
