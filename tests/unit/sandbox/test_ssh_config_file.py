"""The sandbox's /etc/ssh/ssh_config is one of the read-only data files, only when asked for."""

from __future__ import annotations

from corral.broker.config import BrokerConfig, TcpRuleConfig
from corral.broker.tcp import sandbox_ssh_config
from corral.sandbox.namespace import SYSTEM_SSH_CONFIG, _data_files
from corral.sandbox.spec import NetworkSpec, SandboxSpec


def _spec(network: NetworkSpec) -> SandboxSpec:
    return SandboxSpec(argv=("true",), workspace="/w", env=(), network=network)


def test_ssh_config_is_a_data_file_with_tcp_rules() -> None:
    text = sandbox_ssh_config(BrokerConfig(tcp=(TcpRuleConfig(host="a.test", port=22),)), 3128)
    assert text is not None
    files = dict(_data_files(_spec(NetworkSpec(broker_config="{}", ssh_config=text)), []))
    assert files[SYSTEM_SSH_CONFIG] == text.encode()
    assert SYSTEM_SSH_CONFIG == "/etc/ssh/ssh_config"


def test_no_ssh_config_without_it() -> None:
    files = dict(_data_files(_spec(NetworkSpec(broker_config="{}")), []))
    assert SYSTEM_SSH_CONFIG not in files
