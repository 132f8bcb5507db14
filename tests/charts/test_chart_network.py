"""NetworkPolicies let only this release's pods reach the nodes' gRPC ports, anyone (or the configured peers)
reach the gateway's public ports, and Prometheus the metrics ports; ServiceMonitors scrape each role's metrics
port and copy the labels the autoscaling queries select on."""

from __future__ import annotations

import pytest

from tests.charts.chart import NAMESPACE, ROLES, render
from tests.charts.test_chart_operations import ALL_ON, container_ports, covering, pod_labels, selects

COMPONENTS = [component for component, _ in ROLES.values()]
NODES = ["prefill", "decode", "cache-store"]


def rules_for(policy: dict, port: str) -> list[dict]:
    return [rule for rule in policy["spec"]["ingress"] if any(p["port"] == port for p in rule.get("ports", []))]


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_role_has_one_ingress_policy_over_its_own_pods_naming_ports_they_have(component):
    rendered = render(ALL_ON)
    policy = covering(rendered, "NetworkPolicy", component)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = container_ports(rendered, component)
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["port"] in ports, f"{component}: {port['port']} is not a port of the pod"
    for other in set(COMPONENTS) - {component}:
        assert not selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels(rendered, other))


@pytest.mark.parametrize("component", NODES)
def test_node_grpc_ports_take_only_this_releases_pods(component):
    rendered = render(ALL_ON)
    (rule,) = rules_for(covering(rendered, "NetworkPolicy", component), "grpc")
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # no namespaceSelector: the policy's own namespace only
    for caller in COMPONENTS:
        assert selects(peer["podSelector"]["matchLabels"], pod_labels(rendered, caller)), caller
    stranger = {**pod_labels(rendered, "gateway"), "app.kubernetes.io/instance": "another-release"}
    assert not selects(peer["podSelector"]["matchLabels"], stranger)


def test_the_gateways_public_ports_take_anyone_or_the_configured_peers():
    rendered = render(ALL_ON)
    policy = covering(rendered, "NetworkPolicy", "gateway")
    (public,) = rules_for(policy, "grpc")
    assert "from" not in public and {p["port"] for p in public["ports"]} == {"grpc", "http"}
    (admin,) = rules_for(policy, "admin")
    assert admin["from"] == ALL_ON["networkPolicy"]["adminFrom"]
    ingress = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]
    narrowed = render({**ALL_ON, "networkPolicy": {"enabled": True, "gatewayFrom": ingress}})
    gateway = covering(narrowed, "NetworkPolicy", "gateway")
    assert rules_for(gateway, "grpc")[0]["from"] == ingress
    assert rules_for(gateway, "admin") == []  # no adminFrom: nothing reaches Admin over the network


@pytest.mark.parametrize("component", COMPONENTS)
def test_metrics_come_from_prometheus_and_health_from_anywhere(component):
    rendered = render(ALL_ON)
    policy = covering(rendered, "NetworkPolicy", component)
    (metrics,) = rules_for(policy, "metrics")
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    (health,) = rules_for(policy, "health")
    assert "from" not in health  # kubelet probes come from the node


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_role_has_a_service_monitor_on_its_services_metrics_port(component):
    rendered = render(ALL_ON)
    labels = pod_labels(rendered, component)
    monitors = [m for m in rendered.of_kind("ServiceMonitor")
                if (services := [s for s in rendered.of_kind("Service")
                                 if selects(m["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])])
                and all(selects(s["spec"]["selector"], labels) for s in services)]
    assert len(monitors) == 1, component
    monitor = monitors[0]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (service,) = [s for s in rendered.of_kind("Service")
                  if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert container_ports(rendered, component)[port["targetPort"]] == port["port"] == 9090
    assert endpoint["path"] == "/metrics"
    # the series get app_kubernetes_io_instance / _component, which the autoscaling queries select on
    assert set(monitor["spec"]["podTargetLabels"]) == {"app.kubernetes.io/instance", "app.kubernetes.io/component"}
    assert set(monitor["spec"]["podTargetLabels"]) <= set(labels)


def test_no_policy_or_monitor_for_a_disabled_cache_store():
    rendered = render({**ALL_ON, "cacheStore": {"enabled": False}})
    names = [o["metadata"]["name"] for o in rendered.of_kind("NetworkPolicy") + rendered.of_kind("ServiceMonitor")]
    assert names and not [n for n in names if n.endswith("cache-store")]
