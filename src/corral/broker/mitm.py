"""The run's interception CA and the leaf certificates it mints (host side only).

`create_ca(directory)` writes a fresh CA: `ca.pem` (public, what the sandbox
trusts), `bundle.pem` (the host's trust store plus that CA, for clients whose
variable replaces the system store) and `key/ca.key` (0600 below a 0700
directory; it must never be bound into a sandbox). The broker loads the pair
with `CertAuthority.load` and asks `server_context(host)` for a TLS server
context presenting a leaf for `host`, minted on first use and kept in a
bounded LRU cache. Leaves are valid for a day and share one key: the key never
leaves the broker's memory (it reaches OpenSSL through a memfd, not a file).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from corral.errors import BrokerError

__all__ = ["CaFiles", "CertAuthority", "create_ca", "system_bundle"]

_SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
)


def system_bundle() -> bytes:
    """The host's trust store as PEM (empty when the host has none)."""
    paths = [ssl.get_default_verify_paths().cafile, *_SYSTEM_BUNDLES]
    for path in paths:
        if path and os.path.isfile(path):
            with open(path, "rb") as fh:
                return fh.read()
    return b""


@dataclass(frozen=True, slots=True)
class CaFiles:
    """Where `create_ca` put the CA: `public` may be shown to a sandbox, `key` never."""

    public: Path
    cert: Path
    bundle: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def create_ca(directory: Path, key_dir: Path | None = None) -> CaFiles:
    """A new CA below `directory` (created 0700); see the module docstring.

    `key_dir` (created 0700) takes the key instead of `directory/key`: a
    host-private place no sandbox's bind can traverse to (`corral run`).
    """
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"corral run CA {os.urandom(4).hex()}")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    public = directory / "public"
    private = directory / "key" if key_dir is None else key_dir
    for d in (directory, public, private):
        d.mkdir(mode=0o700, exist_ok=True)
    # bwrap binds the bundle as the sandbox's (mapped) user: the path must be
    # traversable; only the key's directory stays closed.
    os.chmod(directory, 0o711)
    os.chmod(public, 0o755)
    os.chmod(private, 0o700)
    key_path = private / "ca.key"
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    cert_path = public / "ca.pem"
    cert_path.write_bytes(pem)
    bundle = system_bundle()
    bundle_path = public / "bundle.pem"
    bundle_path.write_bytes(bundle + (b"" if not bundle or bundle.endswith(b"\n") else b"\n") + pem)
    for p in (cert_path, bundle_path):
        os.chmod(p, 0o644)
    return CaFiles(public=public, cert=cert_path, bundle=bundle_path, key=key_path)


class CertAuthority:
    """Mints leaf certificates for intercepted hosts; see the module docstring."""

    def __init__(
        self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, max_leaves: int
    ) -> None:
        self._cert = cert
        self._key = key
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self._max = max_leaves
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    @classmethod
    def load(cls, cert_path: str, key_path: str, max_leaves: int = 256) -> CertAuthority:
        """Read the CA pair; BrokerError when either is unreadable or not a CA."""
        try:
            with open(cert_path, "rb") as fh:
                cert = x509.load_pem_x509_certificate(fh.read())
            with open(key_path, "rb") as fh:
                key = serialization.load_pem_private_key(fh.read(), password=None)
        except (OSError, ValueError) as exc:
            raise BrokerError(f"cannot load the interception CA: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise BrokerError("the interception CA key is not an EC key")
        return cls(cert, key, max_leaves)

    def mint(self, host: str) -> bytes:
        """PEM of a leaf for `host` (a name or an IP literal), signed by this CA."""
        now = datetime.datetime.now(datetime.UTC)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host[:64]))
            .issuer_name(self._cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM) + self._cert.public_bytes(
            serialization.Encoding.PEM
        )

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server context presenting a leaf for `host`; offers only http/1.1 by ALPN."""
        ctx = self._contexts.get(host)
        if ctx is not None:
            self._contexts.move_to_end(host)
            return ctx
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # h11 speaks HTTP/1.1 only: a client offered h2 would otherwise send
        # frames the broker cannot read.
        ctx.set_alpn_protocols(["http/1.1"])
        # load_cert_chain reads only paths; a memfd keeps the key off disk.
        fd = os.memfd_create("corral-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, self._leaf_key_pem + self.mint(host))
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        except (OSError, ssl.SSLError) as exc:
            raise BrokerError(f"cannot build a certificate for {host}: {exc}") from exc
        finally:
            os.close(fd)
        self._contexts[host] = ctx
        while len(self._contexts) > self._max:
            self._contexts.popitem(last=False)
        return ctx
