"""The chart lints, renders with default and production-like values, and every rendered object validates
against the Kubernetes schema (strict: unknown fields fail), offline. Its values schema follows the code."""

from __future__ import annotations

import importlib.util
import json

import helm_python as helm
import pytest
import yaml
from kubernetes_validate import utils as kubernetes

from tests.charts.chart import CHART, REPO, production_values, render

MIN_KUBERNETES = "1.27"  # Chart.yaml's kubeVersion (native gRPC probes are GA from 1.27)
KUBERNETES_VERSIONS = [MIN_KUBERNETES, kubernetes.latest_version()]
VALUES = ["default", "production"]


def values_named(name: str) -> dict | None:
    return production_values() if name == "production" else None


def load_generator():
    spec = importlib.util.spec_from_file_location("generate_schema", REPO / "charts" / "generate_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_declares_the_minimum_kubernetes_it_is_validated_against():
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == f">={MIN_KUBERNETES}.0-0"


@pytest.mark.parametrize("values", VALUES)
def test_the_chart_lints_clean(values):
    report = helm.lint(CHART, values_named(values), strict=True, kube_version=f"v{MIN_KUBERNETES}.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 = info ("icon is recommended")
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", VALUES)
def test_every_rendered_object_validates_against_the_kubernetes_schema(values, version):
    rendered = render(values_named(values))
    kinds = sorted({o["kind"] for o in rendered.objects})
    core = ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount", "StatefulSet"]
    # production values issue the internal certificates with cert-manager (checked in test_chart_tls.py:
    # its CRD is not part of the Kubernetes schema)
    assert kinds == (sorted([*core, "Certificate"]) if values == "production" else core)
    for obj in rendered.objects:
        if obj["apiVersion"] == "cert-manager.io/v1":
            continue
        try:
            kubernetes.validate(obj, version, strict=True)
        except kubernetes.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {where}: {error.message} (Kubernetes {version})")


def test_the_validator_refuses_what_kubernetes_would():
    """The check above can fail: an unknown field and a wrong type are refused."""
    deployment = render().workload("decode")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["portt"] = 1
    with pytest.raises(kubernetes.ValidationError, match="portt"):
        kubernetes.validate(deployment, kubernetes.latest_version(), strict=True)
    config_map = render().of_kind("ConfigMap")[0]
    config_map["data"]["PDSERVE_THREADS"] = 2
    with pytest.raises(kubernetes.ValidationError):
        kubernetes.validate(config_map, kubernetes.latest_version(), strict=True)


def test_the_values_schema_matches_the_services_settings():
    """values.schema.json lists each service's settings; a new or renamed setting needs `make chart-schema`."""
    generated = json.loads(load_generator().render())
    on_disk = json.loads((CHART / "values.schema.json").read_text())
    assert on_disk == generated, "charts/pdserve/values.schema.json is out of date: run `make chart-schema`"


@pytest.mark.parametrize(("values", "complaint"), [
    ({"prefill": {"config": {"max_num_seq": 64}}}, "'max_num_seq' not allowed"),
    ({"config": {"log_levle": "debug"}}, "'log_levle' not allowed"),
    ({"decode": {"config": {"listen": "0.0.0.0:1"}}}, "'listen' not allowed"),  # set by the chart, per pod
    ({"cacheStore": {"config": {"capacity_bytes": "1G"}}}, "capacity_bytes"),
    ({"gateway": {"config": {"prepare_concurrency": 4}}}, "'prepare_concurrency' not allowed"),  # a prefill setting
    ({"prefil": {"replicas": 2}}, "'prefil' not allowed"),
    ({"cacheStore": {"replicas": 2}}, "cacheStore/replicas"),
    ({"tracing": {"exporter": "jaeger"}}, "tracing/exporter"),
])
def test_a_mistyped_value_fails_the_render_and_names_the_key(values, complaint):
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render(values)


def test_a_path_model_without_a_path_fails_the_render():
    with pytest.raises(helm.HelmRenderError, match=r"model.source=path needs model.path"):
        render({"model": {"source": "path"}})
