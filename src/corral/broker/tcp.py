"""Host services and raw TCP egress: configuration expansion and the sandbox's side (pure).

`[[host_services]]` entries become ordinary destinations: the name
`NAME.corral.internal` (and `host.corral.internal`) resolves, in the broker's
own resolver only, to the host's 127.0.0.1, and is admitted on the declared
port alone with `allow_private`. Inside the sandbox those names do not
resolve at all: HTTP clients hand them to the proxy, raw TCP clients use
SOCKS5 with remote resolution (`ALL_PROXY=socks5h://...`), and ssh uses the
`ProxyCommand` below. The sandbox's own 127.0.0.1 is untouched.

`[[tcp]]` rules are compiled into a policy of their own (`tcp_policy`), the
only one the SOCKS5 server consults: an HTTP rule never opens a raw TCP
stream, and a TCP rule never admits an HTTP request.
"""

from __future__ import annotations

import base64

from corral.broker.config import BrokerConfig, HostServiceConfig, RuleConfig, TcpRuleConfig
from corral.broker.policy import Hook, Policy
from corral.errors import ConfigError

__all__ = [
    "HOST_SERVICE_ADDRESS",
    "HOST_SERVICE_DOMAIN",
    "expand_host_services",
    "parse_host_service_flag",
    "sandbox_env_for",
    "sandbox_ssh_config",
    "sandbox_tcp_env",
    "ssh_config_text",
    "ssh_proxy_command",
    "tcp_policy",
]

HOST_SERVICE_DOMAIN = "corral.internal"
#: Where the broker (in the host's network namespace) reaches a host service.
HOST_SERVICE_ADDRESS = "127.0.0.1"


def expand_host_services(config: BrokerConfig) -> BrokerConfig:
    """`config` with each host service turned into HTTP and TCP rules plus resolver entries."""
    if not config.host_services:
        return config
    rules: list[RuleConfig] = list(config.rules)
    tcp: list[TcpRuleConfig] = list(config.tcp)
    overrides = dict(config.resolver_overrides)
    ports: list[int] = []
    for svc in config.host_services:
        name = f"{svc.name}.{HOST_SERVICE_DOMAIN}"
        rule_id = f"host-service:{svc.name}"
        rules.append(RuleConfig(id=rule_id, host=name, ports=(svc.port,), allow_private=True))
        tcp.append(TcpRuleConfig(id=rule_id, host=name, ports=(svc.port,), allow_private=True))
        overrides[name] = (HOST_SERVICE_ADDRESS,)
        ports.append(svc.port)
    generic = f"host.{HOST_SERVICE_DOMAIN}"
    unique = tuple(dict.fromkeys(ports))
    rules.append(RuleConfig(id="host-service:host", host=generic, ports=unique, allow_private=True))
    tcp.append(
        TcpRuleConfig(id="host-service:host", host=generic, ports=unique, allow_private=True)
    )
    overrides[generic] = (HOST_SERVICE_ADDRESS,)
    return config.model_copy(
        update={
            "rules": tuple(rules),
            "tcp": tuple(tcp),
            "resolver_overrides": overrides,
            "host_services": (),
        }
    )


def tcp_policy(config: BrokerConfig, hooks: tuple[tuple[str, Hook], ...] = ()) -> Policy:
    """The policy SOCKS5 CONNECTs are decided by: the `[[tcp]]` rules only (no interception)."""
    only_tcp = BrokerConfig(rules=tuple(t.as_rule() for t in config.tcp))
    return Policy.from_config(only_tcp, hooks)


# Runs inside the sandbox as ssh's ProxyCommand (argv: code host port proxy_port):
# SOCKS5 CONNECT with the *name* (the broker resolves it), then a byte relay
# between ssh's stdin/stdout and the broker. Only standard-library Python.
_HELPER = b"""
import os, socket, sys, threading
host, port, proxy = sys.argv[2].encode('idna'), int(sys.argv[3]), int(sys.argv[4])
s = socket.create_connection(('127.0.0.1', proxy))
def need(n):
    b = b''
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            sys.exit('corral socks: broker closed the connection')
        b += c
    return b
s.sendall(b'\\x05\\x01\\x00')
if need(2) != b'\\x05\\x00':
    sys.exit('corral socks: broker refused the greeting')
s.sendall(b'\\x05\\x01\\x00\\x03' + bytes([len(host)]) + host + port.to_bytes(2, 'big'))
r = need(4)
need({1: 6, 4: 18}.get(r[3], 6))
if r[1] != 0:
    sys.exit('corral socks: broker refused %s:%d (reply %d)' % (sys.argv[2], port, r[1]))
def up():
    while True:
        d = os.read(0, 65536)
        if not d:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(d)
threading.Thread(target=up, daemon=True).start()
while True:
    d = s.recv(65536)
    if not d:
        break
    os.write(1, d)
"""


def ssh_proxy_command(proxy_port: int) -> str:
    """An ssh `ProxyCommand` reaching %h:%p through the broker's SOCKS5 server.

    The program travels base64-encoded as an argument, so the command holds
    no quote but the two around `-c`'s text and survives both shells it
    passes through (git's for GIT_SSH_COMMAND, ssh's for ProxyCommand).
    """
    code = base64.b64encode(_HELPER).decode()
    run = "import base64,sys;exec(base64.b64decode(sys.argv[1]))"
    return f'python3 -c "{run}" {code} %h %p {proxy_port}'


def sandbox_tcp_env(proxy_port: int) -> dict[str, str]:
    """Variables pointing raw TCP clients (curl's non-HTTP schemes, git over ssh) at SOCKS5."""
    url = f"socks5h://127.0.0.1:{proxy_port}"
    command = ssh_proxy_command(proxy_port)
    return {
        "ALL_PROXY": url,
        "all_proxy": url,
        "CORRAL_SOCKS_PROXY": url,
        "CORRAL_SSH_PROXY_COMMAND": command,
        "GIT_SSH_COMMAND": f"ssh -o 'ProxyCommand={command}'",
    }


def sandbox_env_for(config: BrokerConfig, proxy_port: int) -> dict[str, str]:
    """`sandbox_tcp_env` when `config` has TCP rules or host services, else nothing."""
    return sandbox_tcp_env(proxy_port) if config.tcp or config.host_services else {}


def ssh_config_text(proxy_port: int) -> str:
    """The sandbox's /etc/ssh/ssh_config: every host through the broker.

    ssh takes the rest of a `ProxyCommand` line verbatim, so the command needs
    no quoting beyond its own. A `~/.ssh/config` the sandbox writes is read
    first and may name another ProxyCommand or none; that gains it nothing, as
    the broker is the sandbox's only way out.
    """
    return (
        "# Written by corral (read-only): ssh reaches hosts through the broker's SOCKS5\n"
        "# server, which admits only the [[tcp]] rules.\n"
        "Host *\n"
        f"    ProxyCommand {ssh_proxy_command(proxy_port)}\n"
    )


def sandbox_ssh_config(config: BrokerConfig, proxy_port: int) -> str | None:
    """`ssh_config_text` when `config` has TCP rules or host services, else None."""
    return ssh_config_text(proxy_port) if config.tcp or config.host_services else None


def parse_host_service_flag(flag: str) -> HostServiceConfig:
    """`NAME=PORT` (`corral exec --host-service`); ConfigError when malformed."""
    name, sep, port = flag.partition("=")
    try:
        if not sep or not port.isdigit():
            raise ValueError("expected NAME=PORT")
        return HostServiceConfig(name=name, port=int(port))
    except ValueError as exc:
        first = str(exc).splitlines()
        text = first[-1].strip() if len(first) > 1 else first[0]
        raise ConfigError(f"--host-service {flag!r}: {text}") from None
