"""The cluster CA and a process's Identity: roles in the certificate, cert-manager's file shape, files
re-read when they change, a half-written file never taken."""

from __future__ import annotations

import stat

import pytest
from cryptography import x509

from services.common.tls import identity as identity_module
from services.common.tls.ca import ROLES, ClusterCA, make_cluster_dir, role_dns, role_uri
from services.common.tls.identity import Identity, resolve_dir, roles_of_cert
from tests.common.tls_certs import issue_without_role, serial_of


@pytest.fixture(scope="module")
def ca() -> ClusterCA:
    return ClusterCA.create("test CA")


@pytest.fixture
def recheck_now(monkeypatch):
    """Identity looks at its files' mtimes at every use instead of at most once a second."""
    monkeypatch.setattr(identity_module, "RECHECK_S", 0.0)


def sans(directory) -> x509.SubjectAlternativeName:
    cert = x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def test_an_issued_certificate_names_its_roles_for_both_ends(ca, tmp_path):
    holder = ca.issue(tmp_path / "node", ("prefill", "decode"))
    names = sans(holder)
    assert set(names.get_values_for_type(x509.UniformResourceIdentifier)) == {
        "spiffe://pdserve/prefill", "spiffe://pdserve/decode"}
    assert {"prefill.pdserve.internal", "decode.pdserve.internal"} <= set(names.get_values_for_type(x509.DNSName))
    assert roles_of_cert((holder / "tls.crt").read_bytes()) == {"prefill", "decode"}
    assert Identity(holder).roles == {"prefill", "decode"}
    assert (role_uri("admin"), role_dns("admin")) == ("spiffe://pdserve/admin", "admin.pdserve.internal")


@pytest.mark.parametrize("roles", [(), ("root",), ("prefill", "superuser")])
def test_issuing_refuses_no_role_or_an_unknown_one(ca, tmp_path, roles):
    with pytest.raises(ValueError, match="roles must be some of"):
        ca.issue(tmp_path / "x", roles)
    assert not (tmp_path / "x").exists()


def test_a_cluster_dir_has_the_ca_key_only_beside_the_ca(tmp_path):
    root = make_cluster_dir(tmp_path / "mtls")
    assert (root / "ca" / "ca.key").is_file()
    assert stat.S_IMODE((root / "ca" / "ca.key").stat().st_mode) == 0o600
    for role in ROLES:
        assert sorted(p.name for p in (root / role).iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
        assert stat.S_IMODE((root / role / "tls.key").stat().st_mode) == 0o600
        assert Identity.load(root, role).roles == {role}
    assert ClusterCA.load(root / "ca").cert_pem == (root / "decode" / "ca.crt").read_bytes()


def test_a_certificate_without_a_pdserve_role_is_refused(ca, tmp_path):
    holder = issue_without_role(ca, tmp_path / "norole")
    assert roles_of_cert((holder / "tls.crt").read_bytes()) == frozenset()
    with pytest.raises(ValueError, match=r"names no pdserve role \(a URI SAN spiffe://pdserve/<role>"):
        Identity(holder)


def test_resolve_dir_takes_the_directory_or_its_role_subdirectory_and_names_what_is_missing(ca, tmp_path):
    ca.issue(tmp_path / "decode", ("decode",))
    assert resolve_dir(tmp_path, "decode") == tmp_path / "decode"
    assert resolve_dir(tmp_path / "decode", "prefill") == tmp_path / "decode"  # a Secret mount: as it is
    with pytest.raises(ValueError, match=r"neither .* nor .*prefill holds tls.crt"):
        resolve_dir(tmp_path, "prefill")
    (tmp_path / "decode" / "tls.key").unlink()
    with pytest.raises(ValueError, match=r"has tls.crt but not tls.key"):
        resolve_dir(tmp_path, "decode")


def test_new_files_are_read_after_a_change(ca, tmp_path, recheck_now):
    holder = ca.issue(tmp_path / "node", ("decode",))
    identity = Identity(holder)
    first = identity.current()
    assert identity.current() is first and identity.generation == 0  # nothing changed: the same reading
    ca.issue(holder, ("decode", "prefill"))
    second = identity.current()
    assert second.cert != first.cert and second.key != first.key
    assert second.cert == (holder / "tls.crt").read_bytes()
    assert identity.generation == 1 and identity.roles == {"decode", "prefill"}


def test_files_are_looked_at_no_more_than_once_per_recheck_interval(ca, tmp_path, monkeypatch):
    monkeypatch.setattr(identity_module, "RECHECK_S", 3600.0)
    holder = ca.issue(tmp_path / "node", ("decode",))
    identity = Identity(holder)
    first = identity.current()
    ca.issue(holder, ("decode",))
    assert identity.current() is first and identity.generation == 0
    monkeypatch.setattr(identity_module, "RECHECK_S", 0.0)
    assert identity.current().cert == (holder / "tls.crt").read_bytes() and identity.generation == 1


@pytest.mark.parametrize("damage", ["truncated certificate", "garbage certificate", "certificate without role",
                                    "missing key"])
def test_a_half_written_or_bad_file_keeps_the_last_good_pair(ca, tmp_path, recheck_now, damage):
    holder = ca.issue(tmp_path / "node", ("cache-store",))
    identity = Identity(holder)
    good = identity.current()
    serial = serial_of(holder)
    cert = holder / "tls.crt"
    if damage == "truncated certificate":
        cert.write_bytes(good.cert[: len(good.cert) // 2])
    elif damage == "garbage certificate":
        cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    elif damage == "certificate without role":
        issue_without_role(ca, holder)
    else:
        (holder / "tls.key").unlink()
    for _ in range(3):  # looked at again each time, never taken
        assert identity.current() is good
    assert identity.generation == 0 and identity.roles == {"cache-store"}
    ca.issue(holder, ("cache-store",))  # the writer finishes: taken at the next look
    assert identity.current().cert == (holder / "tls.crt").read_bytes()
    assert serial_of(holder) != serial and identity.generation == 1


def test_channel_credentials_use_the_current_files(ca, tmp_path, recheck_now, monkeypatch):
    holder = ca.issue(tmp_path / "node", ("gateway",))
    identity = Identity(holder)
    seen = []
    monkeypatch.setattr(identity_module.grpc, "ssl_channel_credentials",
                        lambda ca_pem, key, cert: seen.append((ca_pem, key, cert)))
    identity.channel_credentials()
    ca.issue(holder, ("gateway",))
    identity.channel_credentials()
    assert seen[0][2] != seen[1][2] and seen[1] == (ca.cert_pem, (holder / "tls.key").read_bytes(),
                                                    (holder / "tls.crt").read_bytes())
