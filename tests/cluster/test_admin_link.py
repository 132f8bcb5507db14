"""The launcher links its admin certificate at a fixed path while the cluster runs (the README's runbook
names ``~/.cache/pdserve/run/<gateway port>/admin``), replaces a stale link, and removes it at the end."""

from __future__ import annotations

from types import SimpleNamespace

from services.cluster.__main__ import admin_link, linked_admin_certificate


def test_the_admin_certificate_is_linked_while_the_cluster_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    certs = tmp_path / "mtls" / "launcher"
    certs.mkdir(parents=True)
    (certs / "tls.crt").write_text("certificate")
    cluster = SimpleNamespace(address="127.0.0.1:50051", identity=SimpleNamespace(directory=certs))
    link = admin_link("127.0.0.1:50051")
    assert link == tmp_path / "cache" / "run" / "50051" / "admin"
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path)  # left by a cluster that did not stop cleanly
    with linked_admin_certificate(cluster) as linked:
        assert linked == link and (link / "tls.crt").read_text() == "certificate"
    assert not link.exists() and not link.is_symlink()


def test_an_insecure_cluster_links_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    with linked_admin_certificate(SimpleNamespace(address="127.0.0.1:50051", identity=None)) as linked:
        assert linked is None
    assert not (tmp_path / "run").exists()
