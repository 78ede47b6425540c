"""`corral exec --backend microvm` with TLS interception: curl in the guest trusts the run's CA.

The upstream's certificate comes from a throwaway test CA the broker trusts
(`upstream_tls`); in the guest, curl has no `--cacert` and no CA variable:
only the bundle corral puts at /etc/ssl/certs/ca-certificates.crt in the
guest's initramfs can make it accept the broker's leaf. The host-side effect
is the upstream's hit carrying the real credential, swapped in by the broker.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from ..broker.testlib import Hit, RecordingServer, Reply, make_ca
from .conftest import ExecFn

pytestmark = [
    pytest.mark.requires_qemu,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
    pytest.mark.requires_curl,
]


def _echo(hit: Hit) -> Reply:
    return 200, [], f"{hit.method} {hit.path}\n".encode()


def test_curl_in_the_microvm_trusts_the_run_ca_through_the_system_bundle(
    corral_exec: ExecFn, tmp_path: Path
) -> None:
    ca = make_ca(tmp_path / "ca")
    server = RecordingServer({"/": _echo}, ca.server_context())
    try:
        cfg = tmp_path / "corral.toml"
        cfg.write_text(
            'resolver_overrides = { "secure.test" = "127.0.0.1" }\nsystem_dns = false\n'
            f'upstream_tls = {{ ca_bundle = "{ca.ca_pem}" }}\n'
            f'[[rules]]\nhost = "secure.test"\nports = [{server.port}]\nmethods = ["GET"]\n'
            "allow_private = true\n"
            '[[credentials]]\nname = "gh"\nenv = "GH_TOKEN"\nvalue = "env:CORRAL_TEST_GH"\n'
            'hosts = ["secure.test"]\n'
        )
        real = f"ghp_{secrets.token_hex(16)}"
        script = (
            "unset SSL_CERT_FILE CURL_CA_BUNDLE; "
            f'curl -sS -m 120 -H "Authorization: Bearer $GH_TOKEN" https://secure.test:{server.port}/x'
        )
        out = corral_exec(
            "sh",
            "-c",
            script,
            opts=(
                "--backend",
                "microvm",
                "--allow-degraded",
                "kvm",
                "--config",
                str(cfg),
                "--timeout",
                "240",
            ),
            env={**os.environ, "CORRAL_TEST_GH": real},
            timeout=420,
        )
        assert out.code == 0, out.stdout + out.stderr
        assert out.stdout == "GET /x\n"
        assert [h.headers.get("authorization") for h in server.hits] == [f"Bearer {real}"]
    finally:
        server.close()
