"""`corral k8s render`: the manifests a Kubernetes backend applies for a mission's run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add `corral k8s render` to the corral app."""
    k8s = typer.Typer(
        name="k8s", help="Kubernetes: render a run's manifests.", no_args_is_help=True
    )

    @k8s.command("render")
    def render(  # noqa: PLR0917 (typer maps parameters to options)
        mission: Annotated[Path, typer.Argument(help="The mission file (MISSION.md).")],
        runtime_class: Annotated[
            str, typer.Option("--runtime-class", help="gvisor (handler runsc) or kata.")
        ] = "gvisor",
        image: Annotated[
            str, typer.Option("--image", help="The image with corral, python3 and the tools.")
        ] = "corral-sandbox:latest",
        namespace: Annotated[
            str | None,
            typer.Option("--namespace", help="An existing namespace (default: one per run)."),
        ] = None,
        run_id: Annotated[
            str | None, typer.Option("--run-id", help="Default: the mission's name and digest.")
        ] = None,
        broker_ip: Annotated[
            str | None,
            typer.Option("--broker-ip", help="The broker Service's ClusterIP (default: derived)."),
        ] = None,
        service_cidr: Annotated[
            str, typer.Option("--service-cidr", help="The cluster's Service range.")
        ] = "10.96.0.0/12",
        claim: Annotated[
            str | None,
            typer.Option("--claim", help="A ReadWriteMany PVC for the run (default: emptyDir)."),
        ] = None,
    ) -> None:
        """Print the run's manifests (YAML, in apply order) on stdout."""
        from corral.errors import CorralError
        from corral.k8s.plan import MAX_SCENARIO_BYTES, K8sTarget, mission_manifests
        from corral.k8s.yaml_out import dump_manifests
        from corral.run.mission import load_mission

        if runtime_class not in ("gvisor", "kata"):
            print(f"corral k8s: --runtime-class {runtime_class!r}: gvisor or kata", file=sys.stderr)
            raise typer.Exit(2)
        rc: Literal["gvisor", "kata"] = "gvisor" if runtime_class == "gvisor" else "kata"
        try:
            m = load_mission(mission)
            scen = m.scenario_path
            scenario = None
            if scen is not None:
                with scen.open("rb") as fh:
                    # Bounded: a larger one is refused by the rendering anyway.
                    scenario = fh.read(MAX_SCENARIO_BYTES + 1).decode("utf-8")
            target = K8sTarget(
                runtime_class=rc,
                image=image,
                namespace=namespace,
                run_id=run_id,
                broker_ip=broker_ip,
                service_cidr=service_cidr,
                claim=claim,
            )
            text = dump_manifests(mission_manifests(m, target, scenario))
        except (CorralError, OSError, UnicodeDecodeError) as exc:
            print(f"corral k8s: {exc}", file=sys.stderr)
            raise typer.Exit(2) from exc
        sys.stdout.write(text)

    app.add_typer(k8s)
