"""`SandboxSpec`s of one run -> Kubernetes manifests (pure data, no I/O).

Each environment is its own Pod (the pattern of kubernetes-sigs/agent-sandbox):
a RuntimeClass (gVisor or Kata) between it and the node's kernel, non-root,
no privilege escalation, every capability dropped, a read-only root with
emptyDir scratch, no service account token, no service links, no host
namespaces. The broker is a Pod of its own behind a Service: a NetworkPolicy
selects whole Pods, so a broker sidecar could not be the sandbox's only way
out. The sandbox Pods may reach the broker's port and nothing else, not even
DNS: they reach the broker by the Service's fixed ClusterIP, because cluster
DNS recurses to the internet and is a channel of its own (DNS tunnelling).

Manifests are dicts built here and serialised by a YAML dumper
(`corral.k8s.yaml_out`); no mission text is ever pasted into YAML.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Any, Literal

from corral.k8s.names import dns_label
from corral.sandbox.spec import SandboxSpec

__all__ = [
    "BROKER_PORT",
    "PROVIDER_PORT",
    "RUNTIME_HANDLERS",
    "EnvPod",
    "RenderOptions",
    "RuntimeClassName",
    "broker_egress_rules",
    "render_manifests",
    "runtime_class",
    "sandbox_pod",
]

Manifest = dict[str, Any]
RuntimeClassName = Literal["gvisor", "kata"]

#: RuntimeClass name -> the CRI handler the node's containerd knows it by.
RUNTIME_HANDLERS: dict[str, str] = {"gvisor": "runsc", "kata": "kata"}

BROKER_PORT = 3128
#: The synthetic provider, on the broker Pod's own loopback only.
PROVIDER_PORT = 8099

_APP = "corral"
#: Never reachable from the broker: the cluster's own networks and cloud metadata.
_PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16")
_TMP_DEFAULT = 256 << 20
_BROKER_MEMORY = 512 << 20
_PROVIDER_MEMORY = 256 << 20
_WORKSPACE_DEFAULT = 2 << 30


@dataclass(frozen=True, slots=True)
class EnvPod:
    """One sandbox Pod to render: its role, spec and free-text annotations."""

    role: str
    spec: SandboxSpec
    annotations: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """Everything about the cluster side of a rendering (all validated by the caller)."""

    run_id: str
    namespace: str
    create_namespace: bool
    runtime_class: RuntimeClassName
    image: str
    broker_ip: str
    run_root: str
    claim: str | None = None
    disk_bytes: int | None = None


def _labels(opts: RenderOptions, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": _APP,
        "app.kubernetes.io/component": dns_label(role),
        "corral.dev/run": opts.run_id,
    }


def _meta(
    opts: RenderOptions, name: str, role: str, annotations: dict[str, str] | None = None
) -> Manifest:
    meta: Manifest = {"name": name, "namespace": opts.namespace, "labels": _labels(opts, role)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _quantity(n: int) -> str:
    for unit, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _resources(spec: SandboxSpec) -> Manifest:
    lim: dict[str, str] = {}
    if spec.limits.memory_bytes is not None:
        lim["memory"] = _quantity(spec.limits.memory_bytes)
    if spec.limits.cpus is not None:
        lim["cpu"] = f"{round(spec.limits.cpus * 1000)}m"
    if spec.limits.disk_bytes is not None:
        lim["ephemeral-storage"] = _quantity(spec.limits.disk_bytes)
    # requests = limits: the scheduler reserves what the sandbox may use, and
    # with cpu and memory both set the Pod is in the Guaranteed QoS class.
    return {"limits": dict(lim), "requests": dict(lim)} if lim else {}


def _fixed(memory: int) -> Manifest:
    return {"limits": {"memory": _quantity(memory)}, "requests": {"memory": _quantity(memory)}}


def _security_context(uid: int) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _subpath(opts: RenderOptions, path: str) -> str | None:
    root = opts.run_root.rstrip("/") + "/"
    return path[len(root) :] if path.startswith(root) and ".." not in path.split("/") else None


def sandbox_pod(opts: RenderOptions, pod: EnvPod, uid: int = 1000) -> Manifest:
    """The Pod of one environment."""
    spec = pod.spec
    name = dns_label(f"{opts.run_id}-{pod.role}")
    disk = spec.limits.disk_bytes or opts.disk_bytes or _WORKSPACE_DEFAULT
    tmp = min(disk, _TMP_DEFAULT)
    run_volume: Manifest = (
        {"name": "run", "persistentVolumeClaim": {"claimName": opts.claim}}
        if opts.claim is not None
        else {"name": "run", "emptyDir": {"sizeLimit": _quantity(disk)}}
    )
    volumes: list[Manifest] = [
        run_volume,
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(tmp)}},
        {"name": "home", "emptyDir": {"sizeLimit": _quantity(tmp)}},
    ]
    mounts: list[Manifest] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": spec.home},
    ]
    ws = _subpath(opts, spec.workspace)
    if ws:
        mounts.append({"name": "run", "mountPath": spec.workspace, "subPath": ws})
    else:
        # Never the whole run volume (it holds the checks and every snapshot):
        # a workspace outside the run directory is a scratch of its own.
        volumes.append({"name": "workspace", "emptyDir": {"sizeLimit": _quantity(disk)}})
        mounts.append({"name": "workspace", "mountPath": spec.workspace})
    for bind in spec.binds:
        sub = _subpath(opts, bind.path)
        if sub is None:
            # Not part of the run (corral's own files): the image provides it.
            continue
        mounts.append(
            {"name": "run", "mountPath": bind.path, "subPath": sub, "readOnly": not bind.writable}
        )
    container: Manifest = {
        "name": dns_label(spec.env_kind),
        "image": opts.image,
        "command": list(spec.argv[:1]),
        "args": list(spec.argv[1:]),
        "env": [{"name": k, "value": v} for k, v in spec.env],
        "workingDir": spec.workspace,
        "securityContext": _security_context(uid),
        "volumeMounts": mounts,
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    pod_spec: Manifest = {
        "runtimeClassName": opts.runtime_class,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "hostname": dns_label(spec.hostname),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if spec.network.needs_broker:
        # No DNS: the broker's fixed ClusterIP under a name the proxy variables use.
        pod_spec["hostAliases"] = [{"ip": opts.broker_ip, "hostnames": ["corral-broker"]}]
    if spec.limits.timeout_s is not None:
        pod_spec["activeDeadlineSeconds"] = max(1, math.ceil(spec.limits.timeout_s))
    annotations = dict(pod.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(opts, name, pod.role, annotations),
        "spec": pod_spec,
    }


def _ip_net(host: str) -> str | None:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return f"{ip}/{ip.max_prefixlen}"


def broker_egress_rules(
    destinations: tuple[tuple[str, tuple[int, ...]], ...], *, resolve_names: bool
) -> list[Manifest]:
    """NetworkPolicy egress rules of the broker Pod for (host, ports) destinations.

    NetworkPolicy knows IP blocks, not names: an IP literal becomes its own
    /32 (or /128); a name becomes "any public address on its ports", and the
    broker, which resolves and checks every name itself, is what holds the
    line there. Names need the cluster DNS (`resolve_names`).
    """
    rules: list[Manifest] = []
    public_ports: set[int] = set()
    for host, ports in destinations:
        net = _ip_net(host)
        if net is None:
            public_ports.update(ports)
            continue
        rules.append(
            {
                "to": [{"ipBlock": {"cidr": net}}],
                "ports": [{"protocol": "TCP", "port": p} for p in sorted(set(ports))],
            }
        )
    if public_ports:
        rules.append(
            {
                "to": [
                    {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(_PRIVATE)}},
                    {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}},
                ],
                "ports": [{"protocol": "TCP", "port": p} for p in sorted(public_ports)],
            }
        )
    if resolve_names and public_ports:
        rules.append(
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                        },
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        )
    return rules


def runtime_class(name: RuntimeClassName) -> Manifest:
    """The cluster-wide RuntimeClass object (installed once by a cluster admin)."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": RUNTIME_HANDLERS[name],
    }


def _broker(
    opts: RenderOptions,
    broker_config_json: str,
    scenario: str | None,
    egress: tuple[tuple[str, tuple[int, ...]], ...],
    uid: int,
) -> list[Manifest]:
    name = f"{opts.run_id}-broker"[:63].rstrip("-")
    config_name = f"{opts.run_id}-broker-config"[:63].rstrip("-")
    data = {"broker.json": broker_config_json}
    if scenario is not None:
        data["scenario.yaml"] = scenario
    config_map: Manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(opts, config_name, "broker"),
        "data": data,
    }

    def security() -> Manifest:
        return _security_context(uid)

    def mounts() -> list[Manifest]:
        return [
            {"name": "config", "mountPath": "/etc/corral", "readOnly": True},
            {"name": "state", "mountPath": "/var/lib/corral"},
        ]

    containers: list[Manifest] = [
        {
            "name": "broker",
            "image": opts.image,
            "command": ["python3", "-m", "corral.broker"],
            "args": [
                "serve",
                "--config",
                "/etc/corral/broker.json",
                "--journal",
                "/var/lib/corral/journal.sqlite",
                "--run",
                opts.run_id,
                "--env",
                "agent",
                "--listen",
                f"0.0.0.0:{BROKER_PORT}",
            ],
            "ports": [{"name": "proxy", "containerPort": BROKER_PORT, "protocol": "TCP"}],
            "securityContext": security(),
            "volumeMounts": mounts(),
            "resources": _fixed(_BROKER_MEMORY),
        }
    ]
    if scenario is not None:
        # Only on the broker Pod's loopback: the Service exposes the proxy port alone.
        containers.append(
            {
                "name": "provider",
                "image": opts.image,
                "command": ["python3", "-m", "corral"],
                "args": [
                    "provider",
                    "serve",
                    "--scenario",
                    "/etc/corral/scenario.yaml",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(PROVIDER_PORT),
                ],
                "securityContext": security(),
                "volumeMounts": mounts(),
                "resources": _fixed(_PROVIDER_MEMORY),
            }
        )
    labels = _labels(opts, "broker")
    deployment: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(opts, name, "broker"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    # The broker parses every byte the agent sends: it gets the
                    # same user-space kernel between it and the node.
                    "runtimeClassName": opts.runtime_class,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "hostNetwork": False,
                    "hostPID": False,
                    "hostIPC": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": uid,
                        "fsGroup": uid,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": containers,
                    "volumes": [
                        {"name": "config", "configMap": {"name": config_name}},
                        {"name": "state", "emptyDir": {"sizeLimit": "1Gi"}},
                    ],
                },
            },
        },
    }
    service: Manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(opts, name, "broker"),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": opts.broker_ip,
            "selector": dict(labels),
            "ports": [
                {"name": "proxy", "port": BROKER_PORT, "targetPort": BROKER_PORT, "protocol": "TCP"}
            ],
        },
    }
    broker_policy: Manifest = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(opts, f"{name}-policy"[:63].rstrip("-"), "broker"),
        "spec": {
            "podSelector": {"matchLabels": dict(labels)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {
                            "podSelector": {
                                "matchLabels": {
                                    "corral.dev/run": opts.run_id,
                                    "corral.dev/egress": "broker",
                                }
                            }
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": BROKER_PORT}],
                }
            ],
            "egress": broker_egress_rules(egress, resolve_names=True),
        },
    }
    return [broker_policy, config_map, service, deployment]


def _sandbox_policy(opts: RenderOptions) -> Manifest:
    """Every sandbox Pod of the run: no ingress; egress to the broker's port only (or none)."""
    sandbox = {"corral.dev/run": opts.run_id, "corral.dev/egress": "broker"}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(opts, f"{opts.run_id}-sandboxes"[:63].rstrip("-"), "sandbox"),
        "spec": {
            "podSelector": {"matchLabels": sandbox},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [
                {
                    "to": [{"podSelector": {"matchLabels": _labels(opts, "broker")}}],
                    "ports": [{"protocol": "TCP", "port": BROKER_PORT}],
                }
            ],
        },
    }


def _default_deny(opts: RenderOptions) -> Manifest:
    """Every Pod of the run: nothing in, nothing out, unless another policy allows it.

    Policies add up (a connection is allowed if any policy selecting the Pod
    allows it), so this one is the floor: a product or verifier Pod, which no
    other policy selects, has no network at all.
    """
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(opts, f"{opts.run_id}-deny-all"[:63].rstrip("-"), "sandbox"),
        "spec": {
            "podSelector": {"matchLabels": {"corral.dev/run": opts.run_id}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def render_manifests(
    opts: RenderOptions,
    pods: tuple[EnvPod, ...],
    *,
    broker_config_json: str,
    scenario: str | None,
    egress: tuple[tuple[str, tuple[int, ...]], ...],
    uid: int = 1000,
) -> list[Manifest]:
    """Every object of one run, in apply order (namespace, policies, broker, sandboxes).

    The policies come before the Pods they select: a Pod created first would
    run unconfined until its policy exists.
    """
    out: list[Manifest] = []
    if opts.create_namespace:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": opts.namespace,
                    "labels": {
                        **_labels(opts, "run"),
                        # Pod Security Admission: the namespace refuses any Pod
                        # that is not at the "restricted" level.
                        "pod-security.kubernetes.io/enforce": "restricted",
                    },
                },
            }
        )
    out.append(_default_deny(opts))
    out.append(_sandbox_policy(opts))
    out.extend(_broker(opts, broker_config_json, scenario, egress, uid))
    for pod in pods:
        manifest = sandbox_pod(opts, pod, uid)
        labels = manifest["metadata"]["labels"]
        labels["corral.dev/sandbox"] = "true"
        labels["corral.dev/egress"] = "broker" if pod.spec.network.needs_broker else "none"
        out.append(manifest)
    return out
