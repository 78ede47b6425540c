"""`corral k8s render`: the manifests validate against the Kubernetes schema, keep the
sandbox's isolation, are golden-tested, and no mission text can inject YAML or fields."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral.k8s.plan import K8sTarget, broker_ip_for, mission_manifests
from corral.k8s.render import BROKER_PORT
from corral.k8s.yaml_out import dump_manifests
from corral.run.mission import Mission, load_mission, parse_mission

from ._schema import ValidationError, validate

ROOT = Path(__file__).resolve().parents[3]
ALL_EXAMPLES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/MISSION.md"))
# A browser check needs Playwright bound into the verifier, which no Pod has yet:
# the rendering refuses it (test_a_browser_check_is_refused).
BROWSER_EXAMPLES = ["todo-ui"]
EXAMPLES = [e for e in ALL_EXAMPLES if e not in BROWSER_EXAMPLES]
GOLDEN = Path(__file__).parent / "golden"
_DNS1123 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def _render(mission: Mission, target: K8sTarget | None = None) -> list[dict[str, Any]]:
    scen = mission.scenario_path
    text = scen.read_text(encoding="utf-8") if scen is not None and scen.is_file() else None
    return mission_manifests(mission, target or K8sTarget(), text)


def _example(name: str) -> Mission:
    return load_mission(ROOT / "examples" / name / "MISSION.md")


def _kinds(docs: list[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in docs]


def _pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "Pod"]


def test_examples_exist() -> None:
    assert {"todo-api", "todo-cli"} <= set(EXAMPLES)
    assert set(BROWSER_EXAMPLES) <= set(ALL_EXAMPLES)


def test_a_browser_check_is_refused() -> None:
    from corral.errors import CorralError

    with pytest.raises(CorralError, match="browser"):
        _render(_example("todo-ui"))


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("runtime", ["gvisor", "kata"])
def test_examples_validate_against_the_schema(name: str, runtime: str) -> None:
    target = K8sTarget(runtime_class="gvisor" if runtime == "gvisor" else "kata")
    docs = _render(_example(name), target)
    for doc in docs:
        validate(doc)
    # The YAML text is what users apply: it must parse back to the same objects.
    assert list(yaml.safe_load_all(dump_manifests(docs))) == docs


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda p: p["spec"]["containers"][0].update(privileged=True), "unknown field"),
        (lambda p: p["spec"].update(automountServiceAccountTokn=False), "misspelt field"),
        (lambda p: p["spec"].update(hostNetwork="false"), "string for a boolean"),
        (lambda p: p["spec"]["securityContext"].update(runAsUser="1000"), "string for an int"),
        (lambda p: p["spec"].update(containers={"name": "x"}), "object for a list"),
        (lambda p: p["spec"]["containers"][0].pop("name"), "required field missing"),
    ],
)
def test_a_mutated_manifest_fails_validation(mutate: Any, why: str) -> None:
    pod = copy.deepcopy(_pods(_render(_example("todo-api")))[0])
    validate(pod)
    mutate(pod)
    with pytest.raises(ValidationError):
        validate(pod)


@pytest.mark.parametrize("name", EXAMPLES)
def test_golden_rendering(name: str) -> None:
    text = dump_manifests(_render(_example(name)))
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("CORRAL_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"{path.name} differs from the rendering (CORRAL_UPDATE_GOLDEN=1 rewrites it)"
    )


def test_every_sandbox_pod_is_confined() -> None:
    docs = _render(_example("todo-api"))
    pods = _pods(docs)
    assert [p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods] == [
        "agent-s1",
        "product-s1",
        "verifier-s1-c0",
        "verifier-s1-c1",
        "verifier-s1-c2",
    ]
    for pod in pods:
        spec = pod["spec"]
        assert spec["runtimeClassName"] == "gvisor"
        assert spec["automountServiceAccountToken"] is False
        assert spec["enableServiceLinks"] is False
        assert not (spec["hostNetwork"] or spec["hostPID"] or spec["hostIPC"])
        (c,) = spec["containers"]
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 1000
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["resources"]["limits"] == c["resources"]["requests"]
        assert "memory" in c["resources"]["limits"]
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["tmp"]["emptyDir"]["medium"] == "Memory"
        assert "sizeLimit" in vols["run"]["emptyDir"]
        writable = [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")]
        # Scratch, home and the environment's own directory; nothing else.
        assert len(writable) == 3, writable
    agent, product, *verifiers = pods
    assert agent["spec"]["containers"][0]["resources"]["limits"]["memory"] == "512Mi"
    assert agent["spec"]["activeDeadlineSeconds"] == 120
    assert agent["metadata"]["labels"]["corral.dev/egress"] == "broker"
    for p in [product, *verifiers]:
        assert p["metadata"]["labels"]["corral.dev/egress"] == "none"
        assert "hostAliases" not in p["spec"]
    # The agent cannot see the checks (the verifiers can, read-only).
    checks = "/var/lib/corral/runs/" + agent["metadata"]["labels"]["corral.dev/run"] + "/checks"
    assert checks not in [m["mountPath"] for m in agent["spec"]["containers"][0]["volumeMounts"]]
    for v in verifiers:
        (m,) = [m for m in v["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == checks]
        assert m["readOnly"] is True


def test_network_policies_leave_only_the_broker_port() -> None:
    docs = _render(_example("todo-api"))
    run = docs[0]["metadata"]["labels"]["corral.dev/run"]
    pols = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    deny = pols[f"{run}-deny-all"]
    assert deny["podSelector"] == {"matchLabels": {"corral.dev/run": run}}
    assert deny["ingress"] == [] and deny["egress"] == []
    sandboxes = pols[f"{run}-sandboxes"]
    assert sandboxes["ingress"] == []
    (rule,) = sandboxes["egress"]
    # No DNS rule: the broker is reached by its fixed ClusterIP through hostAliases.
    assert rule["ports"] == [{"protocol": "TCP", "port": BROKER_PORT}]
    assert rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "broker"
    broker = pols[f"{run}-broker-policy"]
    # The synthetic provider runs on the broker Pod's loopback: the broker needs no egress.
    assert broker["egress"] == []
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    assert [p["port"] for p in svc["spec"]["ports"]] == [BROKER_PORT]
    agent = _pods(docs)[0]
    (alias,) = agent["spec"]["hostAliases"]
    assert alias["ip"] == svc["spec"]["clusterIP"]
    env = dict((e["name"], e["value"]) for e in agent["spec"]["containers"][0]["env"])
    assert env["HTTPS_PROXY"] == f"http://corral-broker:{BROKER_PORT}"
    assert "corral-broker" in env["NO_PROXY"].split(",")
    assert "127.0.0.1:3128" not in " ".join(agent["spec"]["containers"][0]["args"])


def test_broker_egress_follows_the_allow_list() -> None:
    text = (ROOT / "examples" / "todo-cli" / "MISSION.md").read_text(encoding="utf-8")
    text = text.replace("\n[", '\n[network]\nallow = ["pypi.org", "10.1.2.3:8443"]\n\n[', 1)
    text = text.replace('provider = "synthetic:scenario.yaml"', 'provider = "anthropic"')
    mission = parse_mission(text, ROOT / "examples" / "todo-cli" / "MISSION.md")
    docs = _render(mission)
    for d in docs:
        validate(d)
    (broker,) = [d["spec"] for d in docs if d["metadata"]["name"].endswith("-broker-policy")]
    cidrs = [t["ipBlock"]["cidr"] for r in broker["egress"] for t in r["to"] if "ipBlock" in t]
    assert "10.1.2.3/32" in cidrs and "0.0.0.0/0" in cidrs
    public = [
        r
        for r in broker["egress"]
        if any(t.get("ipBlock", {}).get("cidr") == "0.0.0.0/0" for t in r["to"])
    ]
    assert "169.254.0.0/16" in public[0]["to"][0]["ipBlock"]["except"]
    assert sorted(p["port"] for p in public[0]["ports"]) == [80, 443]
    assert not any(
        c["name"] == "provider"
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    )


_HOSTILE = "x\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: pwn}\n"


def _hostile_mission() -> Mission:
    text = (ROOT / "examples" / "todo-api" / "MISSION.md").read_text(encoding="utf-8")
    q = '"""' + _HOSTILE + '"""'
    text = text.replace('name = "health"', f"name = {q[:-3]}health: x\\n  - y{q[-3:]}")
    text = text.replace(
        'command = "python3 server.py"', f"command = {q[:-3]}python3 server.py # {q[-3:]}"
    )
    text = text.replace(
        'expect_body = "ok"', 'expect_body = "ok"\nheaders = { "X-A" = "b\\n---\\nkind: Secret" }'
    )
    mission = parse_mission(text, ROOT / "examples" / "todo-api" / "MISSION.md")
    # The mission's own validator refuses such a name; the rendering must not rely on it.
    settings = mission.settings.model_copy(update={"name": _HOSTILE})
    return dataclasses.replace(mission, settings=settings)


def test_hostile_mission_text_cannot_inject_objects_or_fields() -> None:
    mission = _hostile_mission()
    assert mission.name == _HOSTILE
    docs = _render(mission)
    benign = _render(_example("todo-api"))
    parsed = list(yaml.safe_load_all(dump_manifests(docs)))
    assert parsed == docs
    assert _kinds(parsed) == _kinds(benign)
    assert "Secret" not in _kinds(parsed)
    for d in parsed:
        validate(d)
        meta = d["metadata"]
        assert _DNS1123.match(meta["name"]), meta["name"]
        for value in meta.get("labels", {}).values():
            assert len(value) <= 63 and re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", value)
    # The text arrives as data where it belongs, verbatim.
    check0 = _pods(parsed)[2]
    assert check0["metadata"]["annotations"]["corral.dev/check-name"].startswith(_HOSTILE)
    product = _pods(parsed)[1]
    assert any(_HOSTILE in a for a in product["spec"]["containers"][0]["args"])


def test_hostile_run_id_and_namespace_flags_are_sanitized() -> None:
    target = K8sTarget(run_id="../../Other Run\n", namespace="kube-system\n---", claim="A B")
    docs = _render(_example("todo-cli"), target)
    for d in docs:
        validate(d)
        assert d["metadata"].get("namespace", "kube-system-x") != "kube-system"
        assert _DNS1123.match(d["metadata"]["name"])
    assert "Namespace" not in _kinds(docs)


def test_broker_ip_is_in_the_static_band() -> None:
    ip = broker_ip_for("todo-api-1234", "10.96.0.0/12")
    assert ip.startswith("10.96.0.") and ip not in ("10.96.0.0", "10.96.0.1", "10.96.0.10")
    assert ip == broker_ip_for("todo-api-1234", "10.96.0.0/12")


def test_broker_pod_is_confined_and_policies_come_first() -> None:
    docs = _render(_example("todo-api"))
    kinds = _kinds(docs)
    # A Pod created before its policy would run unconfined until the policy exists.
    last_policy = max(i for i, k in enumerate(kinds) if k == "NetworkPolicy")
    assert last_policy < min(i for i, k in enumerate(kinds) if k in ("Pod", "Deployment"))
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    spec = dep["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True and "memory" in c["resources"]["limits"]
    # The synthetic provider listens on the broker Pod's loopback only.
    (provider,) = [c for c in spec["containers"] if c["name"] == "provider"]
    assert provider["args"][provider["args"].index("--host") + 1] == "127.0.0.1"
    assert "ports" not in provider


def test_a_workspace_outside_the_run_never_gets_the_run_volume() -> None:
    from corral.k8s.render import EnvPod, RenderOptions, sandbox_pod
    from corral.sandbox.spec import Bind, SandboxSpec

    opts = RenderOptions(
        run_id="r",
        namespace="ns",
        create_namespace=False,
        runtime_class="gvisor",
        image="i",
        broker_ip="10.96.0.2",
        run_root="/var/lib/corral/runs/r",
        claim="shared",
    )
    for workspace in ("/work", "/var/lib/corral/runs/r", "/var/lib/corral/runs/rx/workspace"):
        spec = SandboxSpec(
            argv=("/bin/true",),
            workspace=workspace,
            env=(),
            binds=(Bind("/var/lib/corral/runs/r/../r/checks", writable=False),),
        )
        pod = sandbox_pod(opts, EnvPod("agent", spec))
        validate(pod)
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        assert [m for m in mounts if m["name"] == "run"] == [], (workspace, mounts)


def test_a_scenario_too_large_for_a_configmap_is_refused() -> None:
    from corral.errors import UsageError
    from corral.k8s.plan import MAX_SCENARIO_BYTES

    with pytest.raises(UsageError, match="ConfigMap"):
        mission_manifests(_example("todo-api"), K8sTarget(), "x" * (MAX_SCENARIO_BYTES + 1))
