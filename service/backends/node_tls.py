"""Certificates for Ray's TLS between the nodes of a cluster (``etrain node certs``).

Ray's token keeps out nodes without it; on a network the operator does not trust (no
WireGuard or Tailscale overlay between the machines), Ray's TLS also encrypts its gRPC.
With ``RAY_USE_TLS=1`` every Ray process presents ``RAY_TLS_SERVER_CERT`` to the others and
accepts only peers whose certificate ``RAY_TLS_CA_CERT`` signed, both ways (mutual TLS), and
a client checks that the certificate names the address it dialled. So each node gets its
own key and a certificate for its addresses, signed by one CA whose key stays with the
operator.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.crt", "ca.key"
# Ray's processes are servers to some peers and clients of others.
_BOTH_WAYS = x509.ExtendedKeyUsage(
    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
)
NODE_CERT, NODE_KEY = "node.crt", "node.key"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class NodeCerts:
    """Where a node's TLS files are, and the environment that turns Ray's TLS on."""

    cert: Path
    key: Path
    ca_cert: Path
    created_ca: bool

    def env(self) -> dict[str, str]:
        """``RAY_USE_TLS`` and the three paths, for etrain serve and etrain node join."""
        return {
            "RAY_USE_TLS": "1",
            "RAY_TLS_SERVER_CERT": str(self.cert),
            "RAY_TLS_SERVER_KEY": str(self.key),
            "RAY_TLS_CA_CERT": str(self.ca_cert),
        }


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    """Write ``path`` (a key only for its owner: mode 0600 from its creation)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    days: int,
    until: dt.datetime | None = None,
) -> x509.CertificateBuilder:
    """A certificate for ``key`` valid from a few minutes ago (clocks differ) for ``days``,
    and never past ``until`` (its CA's end)."""
    now = dt.datetime.now(dt.UTC)
    end = now + dt.timedelta(days=days)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(end if until is None else min(end, until))
    )


def _ca(ca_dir: Path, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
    """The CA of ``ca_dir``; made there first if it has none."""
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    if cert_path.is_file() and key_path.is_file():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path} is not an EC key this command made")
        return cert, key, False
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name("etrain-ray-ca"), _name("etrain-ray-ca"), key, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _pem_key(key), secret=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), secret=False)
    return cert, key, True


def _alt_names(addresses: list[str]) -> list[x509.GeneralName]:
    """IP addresses as IP names, anything else as a DNS name."""
    names: list[x509.GeneralName] = []
    for address in addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            names.append(x509.DNSName(address))
    return names


def issue_node_certs(
    out: Path, ca_dir: Path, addresses: list[str], *, name: str = "etrain-ray-node", days: int = 365
) -> NodeCerts:
    """A key and a certificate for the node reached at ``addresses`` (its IPs or names, and
    always 127.0.0.1), signed by the CA of ``ca_dir`` (made if missing), in ``out`` with a
    copy of the CA's certificate. The CA's key stays in ``ca_dir``; keep that off the
    nodes."""
    if not addresses:
        raise ValueError("give the addresses other nodes reach this one at (--address)")
    # Each node's Ray processes also dial their own agents on loopback (the raylet and the
    # GCS its metrics agent): without 127.0.0.1 those handshakes fail.
    addresses = list(dict.fromkeys([*addresses, LOOPBACK]))
    ca_cert, ca_key, created = _ca(ca_dir, days)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(name), ca_cert.subject, key, days, until=ca_cert.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_alt_names(addresses)), critical=False)
        .add_extension(_BOTH_WAYS, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(out / NODE_KEY, _pem_key(key), secret=True)
    _write(out / NODE_CERT, cert.public_bytes(serialization.Encoding.PEM), secret=False)
    _write(out / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM), secret=False)
    return NodeCerts(out / NODE_CERT, out / NODE_KEY, out / CA_CERT, created)
