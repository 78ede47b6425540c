"""pip and npm inside `corral exec` under HTTPS method/path rules (TLS interception).

A local simple index and a tiny npm registry speak HTTPS with a throwaway
test CA the broker trusts (`upstream_tls`); the clients in the sandbox trust
the run's CA only through what corral sets (`PIP_CERT`, `NODE_EXTRA_CA_CERTS`,
the system bundle). Judged on the host: the wheel and the registry requests
the servers received, and the journal's rows for each inner request.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.broker.journal import read_rows

from ..broker.test_clients import PKG, _index, _npm_package, _wheel
from ..broker.testlib import Hit, RecordingServer, Reply, make_ca
from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_curl]


def _config(tmp_path: Path, ca_pem: Path, pypi: int, npm: int) -> Path:
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        'resolver_overrides = { "pypi.test" = "127.0.0.1", "other.test" = "127.0.0.1" }\n'
        f'system_dns = false\nupstream_tls = {{ ca_bundle = "{ca_pem}" }}\n'
        f'[[rules]]\nid = "pypi-read"\nhost = "pypi.test"\nports = [{pypi}]\n'
        'methods = ["GET"]\npath_prefixes = ["/simple/", "/files/"]\nallow_private = true\n'
        f'[[rules]]\nid = "npm-read"\nhost = "other.test"\nports = [{npm}]\n'
        f'methods = ["GET"]\npath_prefixes = ["/{PKG}"]\nallow_private = true\n'
    )
    return cfg


@pytest.mark.requires_npm
def test_pip_download_and_npm_view_under_https_get_rules(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    ca = make_ca(tmp_path / "ca")
    name, wheel = _wheel()
    pypi = RecordingServer(_index(name, wheel), ca.server_context())
    holder: dict[str, object] = {}

    def packument(hit: Hit) -> Reply:
        return 200, [("Content-Type", "application/json")], json.dumps(holder["packument"]).encode()

    # other.test: a name the test CA's certificate covers.
    npm = RecordingServer({f"/{PKG}": packument}, ca.server_context())
    holder["packument"], _ = _npm_package(npm.port)
    try:
        journal = tmp_path / "j.sqlite"
        pip = (
            "python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check"
            f" --retries 0 --timeout 20 --index-url https://pypi.test:{pypi.port}/simple/"
            f" -d dl {PKG}"
        )
        view = (
            "npm view --json --cache /tmp/npm-cache --update-notifier=false"
            f" --registry https://other.test:{npm.port}/ {PKG} version > npm.out"
        )
        # Outside the path rule and a non-GET: both refused inside the tunnel.
        denied = (
            f"{{ curl -s -o /dev/null -w '%{{http_code}} ' https://pypi.test:{pypi.port}/admin;"
            f" curl -s -o /dev/null -w '%{{http_code}}' -X DELETE"
            f" https://other.test:{npm.port}/{PKG}; }} > denied.out"
        )
        out = corral_exec(
            "sh",
            "-c",
            f"{pip} && {view} && {denied}",
            opts=("--config", str(_config(tmp_path, ca.ca_pem, pypi.port, npm.port)),
                  "--journal", str(journal)),
            timeout=120,
        )  # fmt: skip
        assert out.code == 0, out.stdout + out.stderr
        assert (workspace / "dl" / name).read_bytes() == wheel
        assert json.loads((workspace / "npm.out").read_text()) == "1.0.0"
        assert (workspace / "denied.out").read_text() == "403 403"
        assert {h.path for h in pypi.hits} == {f"/simple/{PKG}/", f"/files/{name}"}
        assert {(h.method, h.path) for h in npm.hits} == {("GET", f"/{PKG}")}
        inner = [(r.decision, r.rule, r.target) for r in read_rows(journal)]
        inner = [i for i in inner if i[2].startswith(("GET https://", "DELETE https://"))]
        assert ("allow", "pypi-read", f"GET https://pypi.test:{pypi.port}/files/{name}") in inner
        assert ("allow", "npm-read", f"GET https://other.test:{npm.port}/{PKG}") in inner
        assert ("deny", "default-deny", f"GET https://pypi.test:{pypi.port}/admin") in inner
        assert ("deny", "default-deny", f"DELETE https://other.test:{npm.port}/{PKG}") in inner
    finally:
        pypi.close()
        npm.close()
