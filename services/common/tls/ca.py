"""A throwaway cluster CA and the certificates it issues (``make run``, ``services.cluster``, tests).

Every pdserve certificate names its holder's roles twice, for the two ends of a connection:

- a URI SAN ``spiffe://pdserve/<role>`` per role: a server reads the caller's roles from it
  (:mod:`services.common.tls.roles`);
- a DNS SAN ``<role>.pdserve.internal`` per role: a client connecting to a node of a role verifies the
  server's certificate against that name (``grpc.ssl_target_name_override``), so a prefill node only
  streams KV to a process holding a decode node's certificate, wherever the address came from.

Files are written in cert-manager's shape — ``ca.crt``, ``tls.crt``, ``tls.key`` in one directory per
holder — so the same code reads a Kubernetes Secret mount and a directory made here. Keys are EC P-256
(fast handshakes); the CA's key stays in ``ca.key`` beside the CA directory and never in a holder's.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("gateway", "prefill", "decode", "cache-store", "admin")
SPIFFE_PREFIX = "spiffe://pdserve/"
DNS_SUFFIX = ".pdserve.internal"
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
VALID = datetime.timedelta(days=30)


def role_uri(role: str) -> str:
    return SPIFFE_PREFIX + role


def role_dns(role: str) -> str:
    """The DNS name a server of ``role`` is verified against."""
    return role + DNS_SUFFIX


@dataclass(frozen=True)
class ClusterCA:
    """A CA's certificate and key, in memory."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, name: str = "pdserve throwaway cluster CA") -> ClusterCA:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(cert, key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def save(self, directory: Path) -> None:
        """``ca.crt`` and ``ca.key`` (mode 0600) in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CA_FILE).write_bytes(self.cert_pem)
        _write_private(directory / "ca.key", _key_pem(self.key))

    @classmethod
    def load(cls, directory: Path) -> ClusterCA:
        cert = x509.load_pem_x509_certificate((directory / CA_FILE).read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey), "a pdserve CA key is EC"
        return cls(cert, key)

    def issue(self, directory: Path, roles: tuple[str, ...], *, name: str = "",
              hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), valid: datetime.timedelta = VALID) -> Path:
        """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` for a holder of ``roles`` into ``directory``
        (created; files replaced atomically, so a running process reloading them never reads half a file).
        ``hosts``: DNS names and IP addresses added as SANs (for clients that verify a host name)."""
        unknown = [r for r in roles if r not in ROLES]
        if not roles or unknown:
            raise ValueError(f"roles must be some of {ROLES}, got {roles}")
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name or "+".join(roles))])
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role_uri(r)) for r in roles]
        names += [x509.DNSName(role_dns(r)) for r in roles]
        names += [_host_name(h) for h in hosts]
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + valid)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(self.key, hashes.SHA256()))
        directory.mkdir(parents=True, exist_ok=True)
        _write_private(directory / KEY_FILE, _key_pem(key))
        _write_atomic(directory / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM))
        _write_atomic(directory / CA_FILE, self.cert_pem)
        return directory


def make_cluster_dir(root: Path, holders: dict[str, tuple[str, ...]] | None = None) -> Path:
    """A CA in ``root/ca`` and one holder directory per entry of ``holders`` (name → roles; default: one per
    role, named after it): what ``--mtls-dir root`` reads (a process picks ``root/<its role>``)."""
    ca = ClusterCA.create()
    ca.save(root / "ca")
    for name, roles in (holders or {role: (role,) for role in ROLES}).items():
        ca.issue(root / name, roles, name=name)
    return root


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


def _write_private(path: Path, data: bytes) -> None:
    _write_atomic(path, data, 0o600)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)
