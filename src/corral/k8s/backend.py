"""The Kubernetes backend config variant: it renders; without a cluster it refuses.

`KubernetesConfig` has the shape of the other backend configs (a `kind`
tag, frozen, `load()` importing the implementation), so the coordinator
stays behind the `Backend` interface. Applying manifests to a cluster is
not part of this build: `start` refuses with one line, and says which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from corral.errors import LayerUnavailableError

if TYPE_CHECKING:
    from corral.sandbox.backend import Sandbox, SandboxNet
    from corral.sandbox.spec import SandboxSpec
    from corral.sandbox.unix_admit import UnixConnectEvent

__all__ = ["KubernetesBackend", "KubernetesConfig"]


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """A Pod per environment on a cluster (`kubeconfig`: None means no cluster)."""

    runtime_class: Literal["gvisor", "kata"] = "gvisor"
    image: str = "corral-sandbox:latest"
    kubeconfig: str | None = None
    kind: Literal["kubernetes"] = "kubernetes"

    def load(self) -> KubernetesBackend:
        return KubernetesBackend(self)


class KubernetesBackend:
    """Renders a spec as a Pod (`preview`); `start` refuses (see module docstring)."""

    kind = "kubernetes"

    def __init__(self, config: KubernetesConfig) -> None:
        self._config = config

    def _why_not(self) -> str:
        if self._config.kubeconfig is None:
            return "no cluster configured (give a kubeconfig)"
        return "applying manifests to a cluster is not implemented in this build"

    def check(self, spec: SandboxSpec) -> Mapping[str, str | None]:
        return {"kubernetes": self._why_not()}

    def start(
        self,
        spec: SandboxSpec,
        *,
        parent_cgroup: str | None = None,
        network: Callable[[SandboxNet], None] | None = None,
        stdio: tuple[int | None, int | None, int | None] | None = None,
        unix_observer: Callable[[UnixConnectEvent], None] | None = None,
    ) -> Sandbox:
        raise LayerUnavailableError(
            "kubernetes", self._why_not(), "render with `corral k8s render` and apply it yourself"
        )

    def preview(self, spec: SandboxSpec) -> list[str]:
        """The Pod `spec` would be, as YAML lines."""
        from corral.k8s.names import dns_label
        from corral.k8s.render import EnvPod, RenderOptions, sandbox_pod
        from corral.k8s.yaml_out import dump_manifests

        run = dns_label(spec.run_id or "run", 50)
        opts = RenderOptions(
            run_id=run,
            namespace=dns_label(f"corral-{run}"),
            create_namespace=False,
            runtime_class=self._config.runtime_class,
            image=self._config.image,
            broker_ip="0.0.0.0",
            run_root="/nonexistent",
        )
        pod = sandbox_pod(opts, EnvPod(spec.env_kind, spec))
        return dump_manifests([pod]).splitlines()
