"""Host-side preparation of a run's TLS interception and placeholders (before the sandbox).

When a broker configuration has credentials, or a rule that looks at methods
or paths, `prepare_interception` creates the run's CA in a host-private
directory (`mitm.create_ca`: the key is 0600 and never bound into the
sandbox), gives every credential a fresh placeholder, and returns the new
configuration plus what the sandbox gets: its variables (each credential's
`env` holding the placeholder; the usual CA variables) and the bundle file
(host trust store + the CA) shown at /etc/ssl/certs/ca-certificates.crt.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from corral.broker.config import BrokerConfig, MitmConfig
from corral.broker.credentials import new_placeholder
from corral.errors import ConfigError

if TYPE_CHECKING:
    from corral.sandbox.spec import SandboxSpec

__all__ = [
    "SANDBOX_TRUST_BUNDLE",
    "Interception",
    "apply_to_spec",
    "needs_interception",
    "prepare_interception",
]

#: Where the sandbox reads the bundle (bound over the host's own, read-only).
SANDBOX_TRUST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

#: Variables corral sets itself; a credential may not take them over.
_RESERVED = frozenset(
    {"PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "CORRAL_BROKER_URL"}
)

CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)


@dataclass(frozen=True, slots=True)
class Interception:
    """The configuration with CA and placeholders, and what the sandbox is given."""

    config_json: str
    env: dict[str, str]
    trust_bundle: str


def needs_interception(config: BrokerConfig) -> bool:
    """Whether some destination's requests must be seen: credentials or method/path rules."""
    return bool(config.credentials) or any(
        r.methods is not None or r.path_prefixes is not None for r in config.rules
    )


def prepare_interception(
    config_json: str, directory: Path, key_dir: Path | None = None
) -> Interception | None:
    """Set up interception below `directory` (host-private), or None when none is needed.

    `key_dir`: where the CA key goes instead of below `directory` (see `create_ca`).
    """
    config = BrokerConfig.from_json(config_json)
    if not needs_interception(config):
        return None
    if not os.path.isfile(SANDBOX_TRUST_BUNDLE) or os.path.islink(SANDBOX_TRUST_BUNDLE):
        raise ConfigError(
            f"TLS interception needs the host's trust store as a file at {SANDBOX_TRUST_BUNDLE}"
        )
    from corral.broker.mitm import create_ca

    files = create_ca(directory, key_dir)
    env: dict[str, str] = {}
    credentials = []
    for cred in config.credentials:
        if cred.env in _RESERVED or cred.env.lower().endswith("_proxy"):
            raise ConfigError(f"credential {cred.name}: env {cred.env} is set by corral")
        placeholder = cred.placeholder or new_placeholder(os.urandom(16))
        credentials.append(cred.model_copy(update={"placeholder": placeholder}))
        env[cred.env] = placeholder
    # Every variable names the bundle as the sandbox sees it (host store +
    # CA): SSL_CERT_FILE and friends replace the store rather than add to it.
    env.update(dict.fromkeys(CA_VARIABLES, SANDBOX_TRUST_BUNDLE))
    updated = config.model_copy(
        update={
            "credentials": tuple(credentials),
            "mitm": MitmConfig(ca_cert=str(files.cert), ca_key=str(files.key)),
        }
    )
    return Interception(updated.to_json(), env, str(files.bundle))


def apply_to_spec(
    spec: SandboxSpec, stack: contextlib.ExitStack, key_below: Path | None = None
) -> SandboxSpec:
    """`spec` with interception prepared in private directories `stack` removes.

    The public files (the bundle bwrap binds) go to a fresh directory below
    the system's temporary directory; the key goes there too (`corral exec`)
    or, with `key_below`, to a fresh 0700 directory below it (`corral run`:
    the run's host-private directory, which no sandbox's bind can traverse
    and no snapshot includes).
    """
    if spec.network.broker_config is None or not needs_interception(
        BrokerConfig.from_json(spec.network.broker_config)
    ):
        return spec
    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="corral-tls-")))
    os.chmod(directory, 0o711)  # traversable for bwrap; the key's own directory is 0700
    key_dir: Path | None = None
    if key_below is not None:
        key_below.mkdir(mode=0o700, parents=True, exist_ok=True)
        made = tempfile.TemporaryDirectory(prefix="corral-tls-", dir=key_below)
        key_dir = Path(stack.enter_context(made))
    prepared = prepare_interception(spec.network.broker_config, directory / "ca", key_dir)
    if prepared is None:
        return spec
    env = {**dict(spec.env), **prepared.env}
    return replace(
        spec,
        env=tuple(sorted(env.items())),
        network=replace(
            spec.network,
            broker_config=prepared.config_json,
            trust_bundle=prepared.trust_bundle,
        ),
    )
