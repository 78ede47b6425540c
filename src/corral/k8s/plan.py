"""A mission -> the `SandboxSpec`s a Kubernetes run starts, built as `corral run` builds them.

The specs come from `corral.run.environments` (the agent's of session 1, the
product's, one verifier's per check), for a run directory at the same path in
every Pod (`/var/lib/corral/runs/RUN`, on the run's volume). Only the agent's
way to its broker differs: not its own loopback but the broker Service, by a
name that `hostAliases` maps to the Service's fixed ClusterIP.

Pure apart from reading the mission's scenario file (`scenario_text`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from corral.broker.proxy_env import proxy_env
from corral.errors import UsageError
from corral.k8s.names import dns_label, run_id_for
from corral.k8s.render import (
    BROKER_PORT,
    PROVIDER_PORT,
    EnvPod,
    Manifest,
    RenderOptions,
    RuntimeClassName,
    render_manifests,
)
from corral.run.environments import (
    HOME,
    PROVIDER_ROUTE,
    RunLayout,
    agent_broker_config,
    agent_spec,
    check_spec,
    product_spec,
    provider_choice,
)
from corral.run.mission import Mission
from corral.sandbox.spec import Bind, SandboxSpec

__all__ = [
    "BROKER_HOST",
    "MAX_SCENARIO_BYTES",
    "RUN_ROOT",
    "K8sTarget",
    "broker_ip_for",
    "mission_manifests",
]

RUN_ROOT = "/var/lib/corral/runs"
#: The name the sandbox Pods reach their broker by (`hostAliases`, no DNS).
BROKER_HOST = "corral-broker"
#: Where the image carries corral's own in-sandbox programs.
IMAGE_CORRAL = "/opt/corral"
DEFAULT_SERVICE_CIDR = "10.96.0.0/12"
#: A ConfigMap holds at most 1 MiB; the broker's configuration shares it with the scenario.
MAX_SCENARIO_BYTES = 768 << 10


@dataclass(frozen=True, slots=True)
class K8sTarget:
    """The cluster-side choices of `corral k8s render` (flags)."""

    runtime_class: RuntimeClassName = "gvisor"
    image: str = "corral-sandbox:latest"
    namespace: str | None = None
    run_id: str | None = None
    broker_ip: str | None = None
    service_cidr: str = DEFAULT_SERVICE_CIDR
    claim: str | None = None


def broker_ip_for(run_id: str, service_cidr: str) -> str:
    """A ClusterIP for the run's broker, from the run id, in the low band of the
    Service range (the band Kubernetes keeps for static addresses, KEP-3070)."""
    try:
        net = ipaddress.ip_network(service_cidr)
    except ValueError:
        raise UsageError(f"--service-cidr {service_cidr!r} is not a network") from None
    band = min(max(16, net.num_addresses // 16), 256)
    if band < 16:
        raise UsageError(f"--service-cidr {service_cidr} is too small")
    # Skip .0 (network), .1 (the kubernetes Service) and .10 (kube-dns by convention).
    slots = [i for i in range(2, band) if i != 10]
    h = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big")
    return str(net.network_address + slots[h % len(slots)])


def _checked_ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise UsageError(f"--broker-ip {text!r} is not an IP address") from None


def _agent_via_service(spec: SandboxSpec) -> SandboxSpec:
    """The agent spec with its proxy variables at the broker Service instead of loopback."""
    env = dict(spec.env)
    proxied = proxy_env(BROKER_PORT, host=BROKER_HOST)
    for name in ("NO_PROXY", "no_proxy", "npm_config_noproxy"):
        # The routes are the broker itself: reached directly, not through it.
        proxied[name] = f"{proxied[name]},{BROKER_HOST}"
    env.update(proxied)
    env["CORRAL_BROKER_URL"] = f"http://{BROKER_HOST}:{BROKER_PORT}"
    return dataclasses.replace(spec, env=tuple(sorted(env.items())))


def _agent_pod(layout: RunLayout, mission: Mission, broker_json_doc: object) -> EnvPod:
    from corral.agents.launch import launch_request
    from corral.broker.config import BrokerConfig
    from corral.run.agent_port import resolve_agent
    from corral.run.prompt import build_prompt

    assert isinstance(broker_json_doc, BrokerConfig)
    agent = resolve_agent(mission.settings.agent)
    if mission.settings.agent == "script":
        executable = str(layout.tools / "script_agent.py")
        ro: tuple[str, ...] = (str(layout.tools),)
    else:
        executable = f"{IMAGE_CORRAL}/tools/npm/{agent.name}/bin/{agent.name}"
        ro = ()
    request = launch_request(
        agent,
        build_prompt(mission, 1, (), ()),
        provider=provider_choice(mission.provider),
        executable=executable,
        workspace=str(layout.workspace),
        base_url=f"http://{BROKER_HOST}:{BROKER_PORT}/routes/{PROVIDER_ROUTE}",
        model=mission.settings.model,
        home=HOME,
        request_timeout_s=min(120.0, mission.settings.session.wall_time),
    )
    spec = agent_spec(
        layout,
        mission=mission,
        n=1,
        launch=agent.launch(request),
        broker_config=broker_json_doc,
        ro_paths=ro,
    )
    return EnvPod("agent-s1", _agent_via_service(spec))


def _with_checks(spec: SandboxSpec, layout: RunLayout, mission: Mission) -> SandboxSpec:
    """The checks' mount from the mission, not from whether this host happens to
    have the run directory (`check_spec` looks there): the rendering is the same anywhere."""
    checks = str(layout.checks)
    binds = [b for b in spec.binds if b.path != checks]
    if mission.checks_dir is not None:
        binds.append(Bind(checks, writable=False))
    return dataclasses.replace(spec, binds=tuple(binds))


def _destinations(mission: Mission) -> tuple[tuple[str, tuple[int, ...]], ...]:
    from urllib.parse import urlsplit

    from corral.broker.config import BrokerConfig

    base = BrokerConfig.from_allow_flags(mission.settings.network.allow)
    out = [(r.host.removeprefix("*."), tuple(r.ports)) for r in base.rules]
    ref = mission.provider
    if ref.kind != "synthetic":
        from corral.agents.routes import provider_route

        upstream = str(provider_route(provider_choice(ref), None)["upstream"])
        parts = urlsplit(upstream)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        out.append((parts.hostname or "", (port,)))
    return tuple(out)


def mission_manifests(mission: Mission, target: K8sTarget, scenario: str | None) -> list[Manifest]:
    """Every manifest of `mission`'s run on a cluster (pure; see `render_manifests`)."""
    run_id = (
        dns_label(target.run_id, 50) if target.run_id else run_id_for(mission.name, mission.text)
    )
    namespace = dns_label(target.namespace) if target.namespace else dns_label(f"corral-{run_id}")
    broker_ip = (
        _checked_ip(target.broker_ip)
        if target.broker_ip
        else broker_ip_for(run_id, target.service_cidr)
    )
    if scenario is not None and len(scenario.encode("utf-8", "surrogatepass")) > MAX_SCENARIO_BYTES:
        raise UsageError(
            f"the scenario is larger than {MAX_SCENARIO_BYTES >> 10} KiB (a ConfigMap holds 1 MiB)"
        )
    layout = RunLayout(Path(RUN_ROOT) / run_id)
    ref = mission.provider
    synthetic_url = f"http://127.0.0.1:{PROVIDER_PORT}" if ref.kind == "synthetic" else None
    budget = mission.settings.session.token_budget or mission.settings.token_budget
    broker = agent_broker_config(mission, ref, synthetic_url, budget)
    pods = [_agent_pod(layout, mission, broker)]
    if mission.settings.product is not None:
        pods.append(EnvPod("product-s1", product_spec(layout, mission, 1)))
    checker = Path(IMAGE_CORRAL) / "http_check.py"
    for i, check in enumerate(mission.settings.checks):
        spec = _with_checks(
            check_spec(layout, mission, n=1, i=i, check=check, http_checker=checker),
            layout,
            mission,
        )
        pods.append(EnvPod(f"verifier-s1-c{i}", spec, (("corral.dev/check-name", check.name),)))
    opts = RenderOptions(
        run_id=run_id,
        namespace=namespace,
        create_namespace=target.namespace is None,
        runtime_class=target.runtime_class,
        image=target.image,
        broker_ip=broker_ip,
        run_root=str(layout.root),
        claim=dns_label(target.claim) if target.claim else None,
        disk_bytes=mission.settings.limits.run_disk,
    )
    return render_manifests(
        opts,
        tuple(pods),
        broker_config_json=broker.to_json(),
        scenario=scenario if ref.kind == "synthetic" else None,
        egress=_destinations(mission),
    )
