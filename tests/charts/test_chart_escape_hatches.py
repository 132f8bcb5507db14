"""extraEnv, extraVolumes and extraVolumeMounts (global and per role) reach the pods and pass the strict values
schema, which still refuses a typo'd key; disruption budgets are configurable per role."""

from __future__ import annotations

import helm_python as helm
import pytest

from tests.charts.chart import ROLES, production_values, render
from tests.charts.test_chart_operations import covering

COMPONENTS = [component for component, _ in ROLES.values()]
EXTRAS = {
    "extraEnv": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
    "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch", "readOnly": False}],
    "decode": {"extraEnv": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
               "extraVolumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
               "extraVolumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]},
}


def test_extras_reach_every_pod_after_the_charts_own_and_a_roles_only_its_own():
    rendered = render(EXTRAS)
    for component in COMPONENTS:
        container = rendered.container(component)
        pod = rendered.workload(component)["spec"]["template"]["spec"]
        names = [e["name"] for e in container["env"]]
        assert names.index("HF_HUB_OFFLINE") > names.index("POD_IP")  # after the chart's: $(POD_IP) expands
        assert {"name": "scratch", "emptyDir": {}} in pod["volumes"]
        assert {"name": "scratch", "mountPath": "/scratch", "readOnly": False} in container["volumeMounts"]
        own = component == "decode"
        assert ("NODE_NAME" in names) == own and any(v["name"] == "shm" for v in pod["volumes"]) == own
        assert any(m["mountPath"] == "/dev/shm" for m in container["volumeMounts"]) == own
    decode = rendered.container("decode")["env"]
    assert decode[-1] == EXTRAS["decode"]["extraEnv"][0] and decode[-2]["name"] == "HF_HUB_OFFLINE"


@pytest.mark.parametrize(("values", "complaint"), [
    ({"extraEnvs": []}, "'extraEnvs' not allowed"),
    ({"autoscalling": {}}, "'autoscalling' not allowed"),
    ({"decode": {"autoscaling": {"targets": {"requestWaiting": 2}}}}, "'requestWaiting' not allowed"),
    ({"gateway": {"autoscaling": {"targets": {"kvUsage": 0.5}}}}, "'kvUsage' not allowed"),  # the gateway holds no KV
    ({"extraEnv": [{"value": "no name"}]}, "name"),
    ({"prefill": {"extraVolumeMounts": [{"name": "x"}]}}, "mountPath"),
    ({"extraVolumes": {"name": "x"}}, "extraVolumes"),
    ({"serviceMonitor": {"enabled": True, "interval": "fast"}}, "interval"),
    ({"networkPolicy": {"gatewayFrom": {"podSelector": {}}}}, "gatewayFrom"),
])
def test_the_schema_refuses_typos_and_malformed_extras(values, complaint):
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render(values)


@pytest.mark.parametrize("values", [None, "production"])
def test_budgets_default_to_one_unavailable_and_min_available_wins_when_set(values):
    rendered = render(production_values() if values else None)
    for component in COMPONENTS:
        spec = covering(rendered, "PodDisruptionBudget", component)["spec"]
        if values and component == "gateway":
            assert spec["minAvailable"] == 1 and "maxUnavailable" not in spec  # set in the production values
        elif values and component == "decode":
            assert spec["maxUnavailable"] == "25%"
        else:
            assert spec["maxUnavailable"] == 1 and "minAvailable" not in spec


def test_a_budget_can_be_turned_off_or_set_per_role():
    rendered = render({"prefill": {"pdb": {"enabled": False}}, "decode": {"replicas": 3, "pdb": {"minAvailable": 2}},
                       "gateway": {"pdb": {"maxUnavailable": 0, "minAvailable": None}}})
    assert not [b for b in rendered.of_kind("PodDisruptionBudget") if b["metadata"]["name"].endswith("prefill")]
    assert covering(rendered, "PodDisruptionBudget", "decode")["spec"]["minAvailable"] == 2
    assert covering(rendered, "PodDisruptionBudget", "gateway")["spec"]["maxUnavailable"] == 0  # 0 is kept, not 1
    autoscaling = {"hpa": {"enabled": True}, "minReplicas": 3}
    scaled = render({"decode": {"autoscaling": autoscaling, "pdb": {"minAvailable": 2}}})
    assert covering(scaled, "PodDisruptionBudget", "decode")["spec"]["minAvailable"] == 2  # checked against minReplicas
