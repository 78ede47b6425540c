"""The Kubernetes backend config variant: behind the `Backend` interface, it renders and refuses."""

from __future__ import annotations

import pytest
import yaml

from corral.errors import LayerUnavailableError
from corral.k8s.backend import KubernetesConfig
from corral.sandbox.backend import Backend
from corral.sandbox.spec import Limits, SandboxSpec

from ._schema import validate

SPEC = SandboxSpec(
    argv=("/bin/true",),
    workspace="/work",
    env=(("PATH", "/usr/bin"),),
    limits=Limits(memory_bytes=64 << 20, cpus=0.5, timeout_s=3.5),
    run_id="R 1",
)


def test_start_refuses_without_a_cluster() -> None:
    backend: Backend = KubernetesConfig().load()
    assert backend.check(SPEC) == {"kubernetes": "no cluster configured (give a kubeconfig)"}
    with pytest.raises(LayerUnavailableError, match="no cluster configured"):
        backend.start(SPEC)


def test_start_with_a_kubeconfig_says_applying_is_not_built() -> None:
    backend = KubernetesConfig(kubeconfig="/nonexistent/kubeconfig").load()
    with pytest.raises(LayerUnavailableError, match="not implemented"):
        backend.start(SPEC)


def test_preview_is_a_valid_pod() -> None:
    (pod,) = yaml.safe_load_all(
        "\n".join(KubernetesConfig(runtime_class="kata").load().preview(SPEC))
    )
    validate(pod)
    assert pod["spec"]["runtimeClassName"] == "kata"
    assert pod["spec"]["activeDeadlineSeconds"] == 4
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"memory": "64Mi", "cpu": "500m"}
