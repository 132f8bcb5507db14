"""The chart's transport security: internal mTLS on by default (a Secret per role mounted where
PDSERVE_MTLS_DIR points, cert-manager's shape), optional cert-manager Certificates naming each role as
pdserve reads it, --insecure when turned off, the gateway's Admin port only with mTLS, public TLS on the
gateway from a Secret."""

from __future__ import annotations

import copy

import pytest
from helm_python import HelmRenderError, HelmValuesError

from services.common.config import build_config
from services.common.launch import ROLE_OF_MODULE
from services.common.tls.ca import make_cluster_dir
from tests.charts.chart import ROLES, production_values, render
from tests.charts.test_chart_behaviour import config_classes

COMPONENTS = [component for component, _ in ROLES.values()]
MODULES = dict(ROLES.values())  # component → module
MOUNT = "/etc/pdserve/mtls"
CERT_MANAGER = {"tls": {"internal": {"certManager": {"enabled": True, "issuerRef": {"name": "cluster-ca"}}}}}


def pod(rendered, component: str) -> dict:
    return rendered.workload(component)["spec"]["template"]["spec"]


def volume(rendered, component: str, name: str) -> dict | None:
    return next((v for v in pod(rendered, component)["volumes"] if v["name"] == name), None)


def mount(rendered, component: str, name: str) -> dict | None:
    return next((m for m in rendered.container(component)["volumeMounts"] if m["name"] == name), None)


def role_of(component: str) -> str:
    """The role the process of a component loads its certificate for (``services.common.launch``)."""
    return ROLE_OF_MODULE.get(MODULES[component], "gateway")


@pytest.mark.parametrize("values", [None, "production"])
def test_every_pod_mounts_its_roles_secret_where_its_mtls_dir_points(values):
    rendered = render(production_values() if values else None)
    for component in COMPONENTS:
        settings = rendered.settings(component)
        assert settings["PDSERVE_MTLS_DIR"] == MOUNT and "PDSERVE_INSECURE" not in settings
        assert mount(rendered, component, "mtls") == {"name": "mtls", "mountPath": MOUNT, "readOnly": True}
        secret = volume(rendered, component, "mtls")["secret"]
        assert secret["secretName"] == f"demo-pdserve-{component}-mtls"  # no subPath above: renewals reach it
        assert secret["items"] == [{"key": f, "path": f} for f in ("ca.crt", "tls.crt", "tls.key")]
    for_secrets = {volume(rendered, c, "mtls")["secret"]["secretName"] for c in COMPONENTS}
    assert len(for_secrets) == len(COMPONENTS), "one Secret per role"


def test_the_mounted_files_are_what_the_process_loads_for_its_role(tmp_path):
    """The mount holds ca.crt/tls.crt/tls.key directly (a Secret's keys): the service's config, built from
    the pod's env with the mount replaced by such a directory, loads the identity of its role."""
    make_cluster_dir(tmp_path)
    rendered = render()
    for component, cls in config_classes().items():
        role = role_of(component)
        env = {k: v.replace("$(POD_IP)", "10.1.2.3").replace(MOUNT, str(tmp_path / role))
               for k, v in rendered.settings(component).items()}
        config = build_config(cls, [], env=env)
        assert config.insecure is False and config.identity(role).roles == {role}, component


def test_turned_off_every_process_runs_insecure_and_nothing_is_mounted():
    rendered = render({"tls": {"internal": {"enabled": False, "certManager": {"enabled": True,
                                                                              "issuerRef": {"name": "x"}}}}})
    for component, cls in config_classes().items():
        settings = rendered.settings(component)
        assert settings["PDSERVE_INSECURE"] == "true" and "PDSERVE_MTLS_DIR" not in settings
        assert mount(rendered, component, "mtls") is None and volume(rendered, component, "mtls") is None
        env = {k: v.replace("$(POD_IP)", "10.1.2.3") for k, v in settings.items()}
        assert build_config(cls, [], env=env).identity(role_of(component)) is None
    assert rendered.of_kind("Certificate") == []
    assert "PDSERVE_ADMIN_LISTEN" not in rendered.settings("gateway")  # no plaintext Admin port


def test_the_gateway_serves_admin_on_its_own_port_which_no_service_exposes():
    rendered = render()
    ports = {p["name"]: p["containerPort"] for p in rendered.container("gateway")["ports"]}
    assert rendered.settings("gateway")["PDSERVE_ADMIN_LISTEN"] == f"0.0.0.0:{ports['admin']}"
    assert ports["admin"] not in (ports["grpc"], ports["health"], ports["metrics"])
    for service in rendered.of_kind("Service"):
        assert all(p["targetPort"] != "admin" and p["port"] != ports["admin"] for p in service["spec"]["ports"])
    for component in set(COMPONENTS) - {"gateway"}:
        assert "PDSERVE_ADMIN_LISTEN" not in rendered.settings(component)


@pytest.mark.parametrize("values", [CERT_MANAGER, "production"])
def test_cert_manager_issues_each_role_the_secret_its_pods_mount(values):
    rendered = render(production_values() if values == "production" else values)
    certificates = {c["spec"]["secretName"]: c for c in rendered.of_kind("Certificate")}
    for component in COMPONENTS:
        role = role_of(component)
        spec = certificates.pop(volume(rendered, component, "mtls")["secret"]["secretName"])["spec"]
        assert spec["uris"] == [f"spiffe://pdserve/{role}"] and spec["dnsNames"] == [f"{role}.pdserve.internal"]
        assert set(spec["usages"]) >= {"server auth", "client auth"}
        assert spec["privateKey"]["rotationPolicy"] == "Always"
    (admin,) = certificates.values()  # for operators: grpcurl, Admin/Drain
    assert admin["spec"]["uris"] == ["spiffe://pdserve/admin"]
    assert admin["spec"]["secretName"] == "demo-pdserve-admin-mtls"
    issuer = production_values()["tls"]["internal"]["certManager"]["issuerRef"] if values == "production" else {
        "name": "cluster-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert all(c["spec"]["issuerRef"] == issuer and c["apiVersion"] == "cert-manager.io/v1"
               for c in rendered.of_kind("Certificate"))


def test_given_secret_names_are_mounted_and_issued_and_a_missing_store_gets_none():
    values = {**copy.deepcopy(CERT_MANAGER), "cacheStore": {"enabled": False}}
    values["tls"]["internal"]["secretNames"] = {"decode": "my-decode-cert"}
    values["tls"]["internal"]["certManager"]["admin"] = False
    rendered = render(values)
    assert volume(rendered, "decode", "mtls")["secret"]["secretName"] == "my-decode-cert"
    assert sorted(c["spec"]["secretName"] for c in rendered.of_kind("Certificate")) == [
        "demo-pdserve-gateway-mtls", "demo-pdserve-prefill-mtls", "my-decode-cert"]


def test_cert_manager_without_an_issuer_fails_the_render_naming_the_key():
    with pytest.raises(HelmRenderError, match=r"tls.internal.certManager.issuerRef.name"):
        render({"tls": {"internal": {"certManager": {"enabled": True}}}})


def test_the_gateway_public_tls_comes_from_its_secret_and_nothing_else_sees_it():
    assert "PDSERVE_TLS_CERT" not in render().settings("gateway")  # default: plaintext public ports
    rendered = render({"gateway": {"tls": {"secretName": "public-cert"}}})
    settings = rendered.settings("gateway")
    where = mount(rendered, "gateway", "public-tls")
    assert where["readOnly"] and "subPath" not in where  # a renewed certificate reaches the files
    assert (settings["PDSERVE_TLS_CERT"], settings["PDSERVE_TLS_KEY"]) == (
        f"{where['mountPath']}/tls.crt", f"{where['mountPath']}/tls.key")
    assert volume(rendered, "gateway", "public-tls")["secret"]["secretName"] == "public-cert"
    env = {k: v.replace("$(POD_IP)", "10.1.2.3") for k, v in settings.items()}
    config = build_config(config_classes()["gateway"], [], env=env)
    assert str(config.tls_cert) == settings["PDSERVE_TLS_CERT"] and str(config.tls_key) == settings["PDSERVE_TLS_KEY"]
    for component in set(COMPONENTS) - {"gateway"}:
        assert "PDSERVE_TLS_CERT" not in rendered.settings(component)
        assert mount(rendered, component, "public-tls") is None


@pytest.mark.parametrize(("values", "complaint"), [
    ({"tls": {"internal": {"enabeld": False}}}, "'enabeld' not allowed"),
    ({"tls": {"internal": {"certManager": {"issuerRef": {"kind": "Vault"}}}}}, "kind"),
    ({"gateway": {"config": {"mtls_dir": "/x"}}}, "'mtls_dir' not allowed"),  # set by the chart, from tls
    ({"config": {"insecure": True}}, "'insecure' not allowed"),
    ({"gateway": {"config": {"tls_cert": "/x"}}}, "'tls_cert' not allowed"),
    ({"ports": {"health": 0}}, "health"),
])
def test_mistyped_tls_values_fail_naming_the_key(values, complaint):
    with pytest.raises(HelmValuesError, match=complaint):
        render(values)


def test_the_notes_runbook_calls_internal_ports_with_certificates():
    notes = render(CERT_MANAGER).notes
    assert ("grpcurl -cacert ca.crt -cert tls.crt -key tls.key -servername <role>.pdserve.internal" in notes
            and "demo-pdserve-admin-mtls" in notes and "pdserve.v1.Admin/Drain" in notes)
    assert "-plaintext -d '{\"reason\"" not in notes  # an internal port never takes plaintext
    off = render({"tls": {"internal": {"enabled": False}}}).notes
    assert "grpcurl -plaintext -d '{\"reason\": \"maintenance\"}'" in off and "-cert tls.crt" not in off
