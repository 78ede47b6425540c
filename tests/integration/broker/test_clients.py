"""Real pip and npm installing through the broker from local registries (U4)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from corral.broker.config import BrokerConfig, RuleConfig
from corral.broker.proxy_env import proxy_env

from .conftest import BrokerFactory, ServerFactory
from .testlib import Handler, Hit, Reply, ThrowawayCA

PKG = "corral-probe-pkg"
MODULE = "corral_probe_pkg"


def _wheel() -> tuple[str, bytes]:
    name = f"{MODULE}-0.1-py3-none-any.whl"
    files = {
        f"{MODULE}/__init__.py": b"VALUE = 42\n",
        f"{MODULE}-0.1.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {PKG}\nVersion: 0.1\n".encode()
        ),
        f"{MODULE}-0.1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: corral-test\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{MODULE}-0.1.dist-info/RECORD,,")
    files[f"{MODULE}-0.1.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return name, buf.getvalue()


def _index(wheel_name: str, wheel: bytes) -> dict[str, Handler]:
    sha = hashlib.sha256(wheel).hexdigest()

    def project(hit: Hit) -> Reply:
        html = (
            f'<html><body><a href="/files/{wheel_name}#sha256={sha}">{wheel_name}</a></body></html>'
        )
        return 200, [("Content-Type", "text/html")], html.encode()

    def files(hit: Hit) -> Reply:
        return 200, [("Content-Type", "application/octet-stream")], wheel

    return {f"/simple/{PKG}/": project, "/files/": files}


def _pip(index: str, target: Path, ca: Path, port: int) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(target.parent),
        "PIP_CONFIG_FILE": os.devnull,
        **proxy_env(port),
    }
    argv = [
        sys.executable, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
        "--no-input", "--retries", "0", "--timeout", "10", "--no-deps",
        "--index-url", index, "--cert", str(ca), "--target", str(target), PKG,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90, check=False)


def test_pip_install_through_connect(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, tmp_path: Path
) -> None:
    name, wheel = _wheel()
    index = servers(_index(name, wheel), tls=test_ca)
    evil = servers(_index(name, wheel), tls=test_ca)
    broker = brokers(
        BrokerConfig(
            rules=(RuleConfig(host="pypi.test", ports=(index.port,), allow_private=True),),
            resolver_overrides={"pypi.test": ("127.0.0.1",), "other.test": ("127.0.0.1",)},
            system_dns=False,
        )
    )
    target = tmp_path / "site"
    ok = _pip(f"https://pypi.test:{index.port}/simple/", target, test_ca.ca_pem, broker.port)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (target / MODULE / "__init__.py").read_text() == "VALUE = 42\n"
    assert {h.path.split("#")[0] for h in index.hits} >= {f"/simple/{PKG}/", f"/files/{name}"}

    bad = _pip(
        f"https://other.test:{evil.port}/simple/", tmp_path / "evil", test_ca.ca_pem, broker.port
    )
    assert bad.returncode != 0
    assert evil.hits == []
    assert not (tmp_path / "evil" / MODULE).exists()

    tunnels = [(r.decision, r.target) for r in broker.rows("net_connect")]
    assert ("allow", f"pypi.test:{index.port}") in tunnels
    assert ("deny", f"other.test:{evil.port}") in tunnels
    assert {d for d, t in tunnels if t.startswith("pypi.test")} == {"allow"}


def _npm_package(port: int) -> tuple[dict[str, object], bytes]:
    package_json = json.dumps({"name": PKG, "version": "1.0.0", "main": "index.js"}).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        for path, data in (
            ("package/package.json", package_json),
            ("package/index.js", b"module.exports = 42;\n"),
        ):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    tgz = gzip.compress(raw.getvalue())
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    tarball = f"http://npm.test:{port}/{PKG}/-/{PKG}-1.0.0.tgz"
    packument: dict[str, object] = {
        "name": PKG,
        "dist-tags": {"latest": "1.0.0"},
        "versions": {
            "1.0.0": {
                "name": PKG,
                "version": "1.0.0",
                "main": "index.js",
                "dist": {
                    "tarball": tarball,
                    "shasum": hashlib.sha1(tgz).hexdigest(),
                    "integrity": integrity,
                },
            }
        },
    }
    return packument, tgz


@pytest.mark.requires_npm
def test_npm_install_through_plain_http_proxy(
    servers: ServerFactory, brokers: BrokerFactory, tmp_path: Path
) -> None:
    holder: dict[str, object] = {}

    def packument(hit: Hit) -> Reply:
        return 200, [("Content-Type", "application/json")], json.dumps(holder["packument"]).encode()

    def tarball(hit: Hit) -> Reply:
        data = holder["tgz"]
        assert isinstance(data, bytes)
        return 200, [("Content-Type", "application/octet-stream")], data

    registry = servers({f"/{PKG}": packument, f"/{PKG}/-/": tarball})
    holder["packument"], holder["tgz"] = _npm_package(registry.port)
    broker = brokers(
        BrokerConfig(
            rules=(
                RuleConfig(
                    host="npm.test",
                    ports=(registry.port,),
                    methods=("GET", "HEAD"),
                    path_prefixes=(f"/{PKG}",),
                    allow_private=True,
                ),
            ),
            resolver_overrides={"npm.test": ("127.0.0.1",)},
            system_dns=False,
        )
    )
    project = tmp_path / "proj"
    project.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "npm_config_cache": str(tmp_path / "npm-cache"),
        "npm_config_update_notifier": "false",
        "npm_config_audit": "false",
        "npm_config_fund": "false",
        **proxy_env(broker.port),
    }
    out = subprocess.run(
        [
            "npm",
            "install",
            "--no-package-lock",
            "--registry",
            f"http://npm.test:{registry.port}/",
            PKG,
        ],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    installed = project / "node_modules" / PKG / "index.js"
    assert installed.read_text() == "module.exports = 42;\n"
    requests = [r for r in broker.rows("http_request")]
    assert requests, "npm did not go through the broker"
    assert {r.decision for r in requests} == {"allow"}
    assert any(r.target.endswith(f"/{PKG}/-/{PKG}-1.0.0.tgz") for r in requests)
    # Exactly one journal row per request the registry received.
    assert len(requests) == len(registry.hits)
