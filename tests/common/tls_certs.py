"""Certificates the cluster CA would never issue, for the tests of what a server or an Identity does with one."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.common.tls.ca import CA_FILE, CERT_FILE, KEY_FILE, ClusterCA


def issue_without_role(ca: ClusterCA, directory: Path) -> Path:
    """``ca.crt``/``tls.crt``/``tls.key`` in ``directory``: a certificate ``ca`` signed that names no
    ``spiffe://pdserve/<role>`` (only a DNS name and an unrelated URI), what a misconfigured issuer makes."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [x509.DNSName("somebody.example"), x509.UniformResourceIdentifier("spiffe://other/prefill")]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "no role")]))
            .issuer_name(ca.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca.key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CA_FILE).write_bytes(ca.cert_pem)
    (directory / CERT_FILE).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / KEY_FILE).write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return directory


def serial_of(directory: Path) -> int:
    """The serial number of ``directory/tls.crt``."""
    return x509.load_pem_x509_certificate((directory / CERT_FILE).read_bytes()).serial_number
