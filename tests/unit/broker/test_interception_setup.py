"""Which tunnels are intercepted (pure policy) and the host-side CA preparation."""

from __future__ import annotations

import stat
from pathlib import Path

from corral.broker.actions import NetConnect
from corral.broker.config import BrokerConfig, CredentialConfig, MitmConfig, RuleConfig
from corral.broker.policy import DecisionContext, Policy, decide
from corral.broker.tls_setup import CA_VARIABLES, SANDBOX_TRUST_BUNDLE, prepare_interception

MITM = MitmConfig(ca_cert="/nonexistent/ca.pem", ca_key="/nonexistent/ca.key")
CTX = DecisionContext(addresses=("93.184.216.34",))


def _policy(mitm: MitmConfig | None, **extra: object) -> Policy:
    rules = (
        RuleConfig(host="api.test", methods=("GET",)),
        RuleConfig(host="plain.test"),
    )
    return Policy.from_config(BrokerConfig.model_validate({"rules": rules, "mitm": mitm, **extra}))


def test_restricted_rule_admits_an_intercepted_tunnel_only_with_a_ca() -> None:
    with_ca = decide(NetConnect(host="api.test", port=443), CTX, _policy(MITM))
    assert (with_ca.verdict, with_ca.intercept) == ("allow", True)
    without = decide(NetConnect(host="api.test", port=443), CTX, _policy(None))
    assert without.verdict == "deny"
    plain = decide(NetConnect(host="plain.test", port=443), CTX, _policy(MITM))
    assert (plain.verdict, plain.intercept) == ("allow", False)


def test_credential_host_is_intercepted_but_needs_an_allow_rule() -> None:
    cred = CredentialConfig(name="gh", env="GH", value="env:GH", hosts=("plain.test", "nope.test"))
    policy = _policy(MITM, credentials=(cred,))
    assert decide(NetConnect(host="plain.test", port=443), CTX, policy).intercept
    assert decide(NetConnect(host="nope.test", port=443), CTX, policy).verdict == "deny"


def test_prepare_interception_keeps_the_key_private(tmp_path: Path) -> None:
    config = BrokerConfig(
        rules=(RuleConfig(host="api.test"),),
        credentials=(
            CredentialConfig(name="gh", env="GH_TOKEN", value="env:X", hosts=("a.test",)),
        ),
    )
    prepared = prepare_interception(config.to_json(), tmp_path / "ca")
    assert prepared is not None
    out = BrokerConfig.from_json(prepared.config_json)
    assert out.mitm is not None
    key = Path(out.mitm.ca_key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    # What the sandbox is shown lives apart from the key.
    assert key.parent not in Path(prepared.trust_bundle).parents
    assert b"PRIVATE KEY" not in Path(prepared.trust_bundle).read_bytes()
    assert prepared.env["GH_TOKEN"] == out.credentials[0].placeholder
    assert prepared.env["GH_TOKEN"].startswith("corral-placeholder-")
    assert all(prepared.env[v] == SANDBOX_TRUST_BUNDLE for v in CA_VARIABLES)


def test_no_interception_without_credentials_or_restricted_rules(tmp_path: Path) -> None:
    config = BrokerConfig(rules=(RuleConfig(host="api.test"),))
    assert prepare_interception(config.to_json(), tmp_path / "ca") is None
    assert not (tmp_path / "ca").exists()


def test_run_session_key_goes_below_the_run_and_goes_with_the_session(tmp_path: Path) -> None:
    import contextlib
    import os
    from dataclasses import replace

    from corral.broker.tls_setup import apply_to_spec
    from corral.sandbox.spec import NetworkSpec, SandboxSpec

    cred = CredentialConfig(name="gh", env="GH", value="env:GH", hosts=("api.test",))
    plain = BrokerConfig(rules=(RuleConfig(host="plain.test"),))
    needs = BrokerConfig(rules=(RuleConfig(host="api.test"),), credentials=(cred,))
    run_tls = tmp_path / "run" / "tls"
    base = SandboxSpec(argv=("true",), workspace=str(tmp_path / "ws"), env=())
    with contextlib.ExitStack() as stack:
        spec = replace(base, network=NetworkSpec(broker_config=plain.to_json()))
        assert apply_to_spec(spec, stack, run_tls) is spec
        assert not run_tls.exists()  # nothing made when nothing is intercepted
        spec = replace(base, network=NetworkSpec(broker_config=needs.to_json()))
        out = apply_to_spec(spec, stack, run_tls)
        mitm = BrokerConfig.from_json(out.network.broker_config or "").mitm
        assert mitm is not None and Path(mitm.ca_key).parent.parent == run_tls
        assert stat.S_IMODE(os.stat(Path(mitm.ca_key).parent).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(mitm.ca_key).st_mode) == 0o600
        assert out.network.trust_bundle is not None
        assert not out.network.trust_bundle.startswith(str(run_tls))
    assert list(run_tls.iterdir()) == []
    assert not Path(out.network.trust_bundle).exists()
