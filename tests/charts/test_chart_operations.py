"""The chart's operations features: autoscaling (HPA with prometheus-adapter rules, or KEDA), disruption
budgets, ServiceMonitors, NetworkPolicies and the escape hatches (extraEnv, extraVolumes, extraVolumeMounts).
Everything on and everything off renders and validates; each object has the shape its consumer needs, and the
metrics it names are ones the code exposes."""

from __future__ import annotations

import re

import helm_python as helm
import pytest
import yaml
from kubernetes_validate import utils as kubernetes

from tests.charts.chart import NAMESPACE, RELEASE, ROLES, render
from tests.charts.exposed_metrics import label_values, series_names

COMPONENTS = [component for component, _ in ROLES.values()]
SCALED = {"gateway": "gateway", "prefill": "prefill", "decode": "decode"}  # values key → component
CRDS = {"monitoring.coreos.com/v1", "keda.sh/v1alpha1", "cert-manager.io/v1"}  # not in the Kubernetes schema
ENGINE_TARGETS = {"requestsWaiting": 3, "kvUsage": 0.8, "ttftSeconds": 1.5, "cpuUtilization": 75}
ALL_ON = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "networkPolicy": {"enabled": True, "adminFrom": [{"podSelector": {"matchLabels": {"role": "operator"}}}]},
    "extraEnv": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
    "extraVolumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
    "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "gateway": {"autoscaling": {"hpa": {"enabled": True}, "maxReplicas": 3}},
    "prefill": {"autoscaling": {"keda": {"enabled": True}, "targets": ENGINE_TARGETS}},
    "decode": {"autoscaling": {"hpa": {"enabled": True}, "minReplicas": 2, "maxReplicas": 8, "targets": ENGINE_TARGETS,
                               "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}},
               "extraEnv": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
}
ALL_OFF = {"serviceMonitor": {"enabled": False}, "networkPolicy": {"enabled": False},
           **{key: {"pdb": {"enabled": False}} for key in ("gateway", "prefill", "decode", "cacheStore")}}
OPERATIONS_KINDS = {"HorizontalPodAutoscaler", "ScaledObject", "ServiceMonitor", "NetworkPolicy", "PodDisruptionBudget"}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(rendered, component: str) -> dict[str, str]:
    return rendered.workload(component)["spec"]["template"]["metadata"]["labels"]


def container_ports(rendered, component: str) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in rendered.container(component)["ports"]}


def covering(rendered, kind: str, component: str) -> dict:
    """The one object of ``kind`` whose pod selector picks ``component``'s pods."""
    labels = pod_labels(rendered, component)
    found = [o for o in rendered.of_kind(kind) if selects(
        (o["spec"].get("podSelector") or o["spec"]["selector"])["matchLabels"], labels)]
    assert len(found) == 1, f"{kind} for {component}: {len(found)}"
    return found[0]


@pytest.mark.parametrize("version", [kubernetes.latest_version(), "1.27"])
@pytest.mark.parametrize("values", ["on", "off"])
def test_everything_on_and_everything_off_renders_and_validates(values, version):
    rendered = render(ALL_ON if values == "on" else ALL_OFF)
    kinds = {o["kind"] for o in rendered.objects} & OPERATIONS_KINDS
    assert kinds == (OPERATIONS_KINDS if values == "on" else set())
    for obj in rendered.objects:
        if obj["apiVersion"] in CRDS:
            continue
        try:
            kubernetes.validate(obj, version, strict=True)
        except kubernetes.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {where}: {error.message} (Kubernetes {version})")


def test_the_defaults_scale_nothing_and_keep_their_replicas():
    rendered = render()
    assert not rendered.of_kind("HorizontalPodAutoscaler") and not rendered.of_kind("ScaledObject")
    assert not [o for o in rendered.of_kind("ConfigMap") if o["metadata"]["name"].endswith("prometheus-adapter-rules")]
    for component in SCALED.values():
        assert rendered.workload(component)["spec"]["replicas"] == 1


def test_a_scaled_deployment_leaves_its_replicas_to_the_scaler():
    rendered = render(ALL_ON)
    for kind, component in (("HorizontalPodAutoscaler", "gateway"), ("ScaledObject", "prefill"),
                            ("HorizontalPodAutoscaler", "decode")):
        deployment = rendered.workload(component)
        assert "replicas" not in deployment["spec"], component  # an upgrade must not reset what the scaler chose
        (scaler,) = [o for o in rendered.of_kind(kind) if o["spec"]["scaleTargetRef"]["name"]
                     == deployment["metadata"]["name"]]
        assert scaler["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert rendered.workload("cache-store")["spec"]["replicas"] == 1


def test_the_hpa_scales_on_pdserve_metrics_that_the_adapter_rules_serve():
    rendered = render(ALL_ON)
    hpa = rendered.get("HorizontalPodAutoscaler", rendered.workload("decode")["metadata"]["name"])["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 8)
    assert hpa["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    by_type = {m["type"]: [] for m in hpa["metrics"]}
    for metric in hpa["metrics"]:
        by_type[metric["type"]].append(metric[metric["type"].lower()])
    pods = {m["metric"]["name"]: m["target"] for m in by_type["Pods"]}
    assert pods == {"pdserve_requests_waiting": {"type": "AverageValue", "averageValue": "3"},
                    "pdserve_kv_usage_ratio": {"type": "AverageValue", "averageValue": "800m"}}
    (external,) = by_type["External"]
    assert external["target"] == {"type": "Value", "value": "1500m"}
    assert external["metric"]["selector"]["matchLabels"] == {"app_kubernetes_io_instance": RELEASE,
                                                             "app_kubernetes_io_component": "gateway"}
    (cpu,) = by_type["Resource"]
    assert cpu == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 75}}
    rules = adapter_rules(rendered)
    served = {rule_name(rule) for rule in rules["rules"]}
    assert set(pods) <= served
    assert external["metric"]["name"] in {rule_name(rule) for rule in rules["externalRules"]}
    gateway = rendered.get("HorizontalPodAutoscaler", rendered.workload("gateway")["metadata"]["name"])["spec"]
    assert {m["pods"]["metric"]["name"] for m in gateway["metrics"] if m["type"] == "Pods"} <= served


def adapter_rules(rendered) -> dict:
    (config_map,) = [o for o in rendered.of_kind("ConfigMap")
                     if o["metadata"]["name"].endswith("prometheus-adapter-rules")]
    return yaml.safe_load(config_map["data"]["config.yaml"])


def rule_name(rule: dict) -> str:
    """The metric name prometheus-adapter serves for a rule (its `as`, else the series name it matches)."""
    return rule["name"].get("as") or rule["name"]["matches"].strip("^$")


def promql_metrics(query: str) -> set[str]:
    return set(re.findall(r"\b(pdserve_[a-z_]+)\s*\{", query))


def test_every_series_the_queries_read_is_one_the_code_exposes():
    """Adapter rules and KEDA triggers name real series (the gateway's histogram buckets, the nodes' gauges),
    and the KV usage sums states that pdserve_kv_blocks really has."""
    rendered = render(ALL_ON)
    rules = adapter_rules(rendered)
    queries = [q for rule in rules["rules"] + rules["externalRules"]
               for q in (rule["seriesQuery"], rule["metricsQuery"])]
    queries += [t["metadata"]["query"] for o in rendered.of_kind("ScaledObject") for t in o["spec"]["triggers"]
                if t["type"] == "prometheus"]
    named = set().union(*(promql_metrics(q) for q in queries))
    assert {"pdserve_requests_waiting", "pdserve_kv_blocks", "pdserve_request_ttft_seconds_bucket"} <= named
    assert named <= series_names(), f"not exposed by the code: {sorted(named - series_names())}"
    for rule in rules["rules"] + rules["externalRules"]:
        assert re.fullmatch(rule["name"]["matches"], promql_metrics(rule["seriesQuery"]).pop())
    for query in queries:
        for states in re.findall(r'state=~"([^"]+)"', query):
            assert set(states.split("|")) <= label_values("pdserve_kv_blocks", "state"), states


def test_keda_triggers_query_this_releases_role_with_the_same_targets():
    rendered = render(ALL_ON)
    (scaled,) = rendered.of_kind("ScaledObject")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == rendered.workload("prefill")["metadata"]["name"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 4)
    triggers = {t.get("name", t["type"]): t for t in spec["triggers"]}
    assert triggers["cpu"] == {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "75"}}
    waiting = triggers["requests-waiting"]
    assert waiting["metricType"] == "AverageValue" and waiting["metadata"]["threshold"] == "3"
    assert triggers["kv-usage"]["metricType"] == "Value" and triggers["kv-usage"]["metadata"]["threshold"] == "0.8"
    labels = pod_labels(rendered, "prefill")
    own = (f'namespace="{NAMESPACE}",app_kubernetes_io_instance="{labels["app.kubernetes.io/instance"]}",'
           f'app_kubernetes_io_component="prefill"')
    assert own in waiting["metadata"]["query"] and own in triggers["kv-usage"]["metadata"]["query"]
    ttft = triggers["ttft-seconds"]["metadata"]
    assert 'app_kubernetes_io_component="gateway"' in ttft["query"]
    assert ttft["query"].startswith("histogram_quantile(0.9,")
    for trigger in triggers.values():
        if trigger["type"] == "prometheus":
            assert trigger["metadata"]["serverAddress"].startswith("http")


@pytest.mark.parametrize(("values", "complaint"), [
    ({"decode": {"autoscaling": {"hpa": {"enabled": True}, "keda": {"enabled": True}}}},
     r"decode.autoscaling: hpa.enabled and keda.enabled are both true; they are mutually exclusive"),
    ({"prefill": {"autoscaling": {"hpa": {"enabled": True}, "targets": {"requestsWaiting": 0}}}},
     r"prefill.autoscaling: no target is set"),
    ({"gateway": {"autoscaling": {"keda": {"enabled": True}, "minReplicas": 5, "maxReplicas": 2}}},
     r"gateway.autoscaling: maxReplicas \(2\) is below minReplicas \(5\)"),
    ({"prefill": {"replicas": 2, "pdb": {"minAvailable": 2}}}, r"prefill.pdb.minAvailable \(2\) is not below"),
])
def test_a_configuration_no_scaler_or_budget_can_run_fails_the_render(values, complaint):
    with pytest.raises(helm.HelmRenderError, match=complaint):
        render(values)
