"""What the rendered chart does: discovery by headless DNS, gRPC health probes, a grace period that covers
the drain, GPUs only where asked, a PDB per role, settings the services really have."""

from __future__ import annotations

import dataclasses

import helm_python as helm
import pytest

from services.common.config import build_config, env_name
from tests.charts.chart import NAMESPACE, ROLES, production_values, render

CLUSTER = [None, "production"]
COMPONENTS = [component for component, _ in ROLES.values()]


def values_named(values: str | dict | None) -> dict | None:
    """None: the defaults; "production": ci/production-values.yaml; a dict: those values."""
    return production_values() if values == "production" else values


def config_classes() -> dict[str, type]:
    from services.cache_store.config import CacheStoreConfig
    from services.decode_node.config import DecodeNodeConfig
    from services.gateway.config import GatewayConfig
    from services.prefill_node.config import PrefillNodeConfig

    return {"gateway": GatewayConfig, "prefill": PrefillNodeConfig, "decode": DecodeNodeConfig,
            "cache-store": CacheStoreConfig}


def pod_labels(rendered, component: str) -> dict[str, str]:
    return rendered.workload(component)["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("values", CLUSTER)
def test_the_gateway_finds_every_node_through_a_headless_service(values):
    rendered = render(values_named(values))
    settings = rendered.settings("gateway")
    for variable, component in (("PDSERVE_PREFILL", "prefill"), ("PDSERVE_DECODE", "decode"),
                                ("PDSERVE_CACHE_STORE", "cache-store")):
        entry = settings[variable]
        assert entry.startswith("dns:///"), entry
        host, _, port = entry.removeprefix("dns:///").rpartition(":")
        name, namespace, svc, domain = host.split(".", 3)
        assert (namespace, svc, domain) == (NAMESPACE, "svc", "cluster.local"), entry
        service = rendered.get("Service", name)
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is False  # loading or draining pods are left out
        assert selects(service["spec"]["selector"], pod_labels(rendered, component))
        for other in set(COMPONENTS) - {component}:
            assert not selects(service["spec"]["selector"], pod_labels(rendered, other))
        (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
        assert int(port) == grpc["port"] and grpc["targetPort"] == "grpc"


def test_nodes_reach_cache_store_pod_zero_by_its_stable_name():
    rendered = render()
    store = rendered.workload("cache-store")
    assert store["kind"] == "StatefulSet"
    pod_zero = f"{store['metadata']['name']}-0.{store['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local:50051"
    assert rendered.settings("prefill")["PDSERVE_CACHE_STORE"] == pod_zero
    assert rendered.settings("decode")["PDSERVE_OFFLOAD_CACHE_STORE"] == pod_zero
    without = render({"cacheStore": {"enabled": False}})
    assert "PDSERVE_CACHE_STORE" not in without.settings("prefill") | without.settings("gateway")
    assert not [o for o in without.objects if o["metadata"]["name"].endswith("cache-store")]


@pytest.mark.parametrize("values", CLUSTER)
def test_probes_are_grpc_health_checks_on_the_plaintext_health_port(values):
    """A kubelet gRPC probe presents no certificate: the probes target the health-only port
    (--health-listen), never the mTLS gRPC port."""
    rendered = render(values_named(values))
    for component in COMPONENTS:
        container = rendered.container(component)
        (grpc_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "grpc"]
        (health_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "health"]
        assert rendered.settings(component)["PDSERVE_LISTEN"] == f"0.0.0.0:{grpc_port}"
        assert rendered.settings(component)["PDSERVE_HEALTH_LISTEN"] == f"0.0.0.0:{health_port}"
        assert health_port != grpc_port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": health_port}, (component, probe)
        metrics_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
        assert rendered.settings(component)["PDSERVE_METRICS_LISTEN"] == f"0.0.0.0:{metrics_port}"
        annotations = rendered.workload(component)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(metrics_port)
    startup = rendered.container("decode")["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # room to load a model


@pytest.mark.parametrize("values", [None, "production", {"decode": {"config": {"drain_timeout_s": 600}}},
                                    {"config": {"grace_s": 42.5}, "gateway": {"preStopSleepSeconds": 30}}])
def test_the_grace_period_covers_the_prestop_sleep_and_the_whole_drain(values):
    rendered = render(values_named(values))
    for component in COMPONENTS:
        pod = rendered.workload(component)["spec"]["template"]["spec"]
        settings = rendered.settings(component)
        drain = float(settings["PDSERVE_DRAIN_TIMEOUT_S"]) + float(settings["PDSERVE_GRACE_S"])
        (container,) = pod["containers"]
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "sleep"
        assert pod["terminationGracePeriodSeconds"] >= int(command[1]) + drain + 1, component
        liveness = container["livenessProbe"]
        assert liveness["periodSeconds"] * liveness["failureThreshold"] > drain, "liveness would kill a drain"
    if isinstance(values, dict) and "decode" in values:
        assert rendered.workload("decode")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 615
        assert rendered.settings("prefill")["PDSERVE_DRAIN_TIMEOUT_S"] == "30"


@pytest.mark.parametrize(("values", "gpus"), [
    (None, {}), ("production", {"prefill": 1, "decode": 1}), ({"prefill": {"gpu": 2}}, {"prefill": 2}),
    ({"decode": {"gpu": 1, "gpuResource": "amd.com/gpu"}}, {"decode": 1}),
])
def test_a_gpu_is_requested_only_where_set(values, gpus):
    rendered = render(values_named(values))
    for component in COMPONENTS:
        resources = rendered.container(component)["resources"]
        found = {k: v for part in ("requests", "limits") for k, v in resources.get(part, {}).items() if "gpu" in k}
        if component in gpus:
            (name,) = set(found)
            assert resources["limits"][name] == resources["requests"][name] == gpus[component]
        else:
            assert found == {}, component


def test_the_production_values_run_the_engines_on_the_gpus_they_request():
    """A GPU requested while the engine runs on the CPU is held unused."""
    rendered = render(values_named("production"))
    for component in ("prefill", "decode"):
        assert rendered.settings(component)["PDSERVE_DEVICE"] == "cuda", component


@pytest.mark.parametrize("values", CLUSTER)
def test_every_role_has_a_disruption_budget(values):
    rendered = render(values_named(values))
    budgets = rendered.of_kind("PodDisruptionBudget")
    for component in COMPONENTS:
        labels = pod_labels(rendered, component)
        covering = [b for b in budgets if selects(b["spec"]["selector"]["matchLabels"], labels)]
        assert len(covering) == 1, component
        spec = covering[0]["spec"]
        assert ("minAvailable" in spec) != ("maxUnavailable" in spec)
    assert len(budgets) == len(COMPONENTS)


@pytest.mark.parametrize("values", CLUSTER)
def test_every_setting_is_one_the_service_has_and_parses(values):
    """Each PDSERVE_* variable a pod gets names a field of its service's config and builds that config."""
    rendered = render(values_named(values))
    for component, cls in config_classes().items():
        settings = rendered.settings(component)
        known = {env_name(f.name) for f in dataclasses.fields(cls) if f.init}
        assert set(settings) <= known, f"{component}: not settings of {cls.__name__}: {sorted(set(settings) - known)}"
        env = {k: v.replace("$(POD_IP)", "10.1.2.3") for k, v in settings.items()}
        config = build_config(cls, [], env=env)
        assert config.listen == "0.0.0.0:50051" and config.metrics_listen == "0.0.0.0:9090"
        if component in ("prefill", "decode"):
            assert config.advertise == "10.1.2.3:50051"


def test_every_process_advertises_its_pod_ip():
    """NodeStatus addresses and metrics URLs name the pod, not the 0.0.0.0 it binds."""
    rendered = render()
    for component in COMPONENTS:
        env = rendered.container(component)["env"]
        names = [e["name"] for e in env]
        assert names.index("POD_IP") < names.index("PDSERVE_ADVERTISE")  # $(POD_IP) expands only if defined earlier
        pod_ip = next(e for e in env if e["name"] == "POD_IP")
        assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        advertise = next(e for e in env if e["name"] == "PDSERVE_ADVERTISE")
        assert advertise["value"] == "$(POD_IP):50051", component


@pytest.mark.parametrize(("values", "model"), [(None, None), ("production", "/models/SmolLM2-135M-Instruct"),
                                               ({"model": {"source": "path", "path": "/opt/m.gguf"}}, "/opt/m.gguf")])
def test_the_model_comes_from_the_image_or_a_mounted_volume(values, model):
    rendered = render(values_named(values))
    for component in COMPONENTS:
        pod = rendered.workload(component)["spec"]["template"]["spec"]
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        uses_model = component != "cache-store"
        assert rendered.settings(component).get("PDSERVE_MODEL") == (model if uses_model else None)
        has_volume = values == "production" and uses_model
        assert ("model" in mounts) == has_volume
        if has_volume:
            assert mounts["model"]["readOnly"] is True and model.startswith(mounts["model"]["mountPath"] + "/")
            (volume,) = [v for v in pod["volumes"] if v["name"] == "model"]
            assert volume["persistentVolumeClaim"]["claimName"] == "llm-models"


def test_pods_run_locked_down():
    rendered = render()
    for component in COMPONENTS:
        pod = rendered.workload(component)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert pod["enableServiceLinks"] is False  # Service env vars would be named PDSERVE_<SVC>_PORT
        assert pod["automountServiceAccountToken"] is False


def test_the_cache_store_disk_tier_lives_on_its_volume():
    assert "PDSERVE_DISK_DIR" not in render().settings("cache-store")
    rendered = render(production_values())
    store = rendered.workload("cache-store")
    mounts = {m["name"]: m["mountPath"] for m in store["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert rendered.settings("cache-store")["PDSERVE_DISK_DIR"] == mounts["kv-disk"]
    (claim,) = store["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "kv-disk" and claim["spec"]["resources"]["requests"]["storage"] == "600Gi"
    ephemeral = render({"cacheStore": {"disk": {"enabled": True}}}).workload("cache-store")
    assert "volumeClaimTemplates" not in ephemeral["spec"]
    assert any(v["name"] == "kv-disk" and "emptyDir" in v for v in ephemeral["spec"]["template"]["spec"]["volumes"])


def test_tracing_is_off_unless_an_exporter_is_set():
    def otel(rendered, component: str) -> dict[str, str]:
        env = rendered.container(component)["env"]
        return {e["name"]: e.get("value") for e in env if e["name"].startswith("OTEL_")}

    assert otel(render(), "decode") == {"OTEL_TRACES_EXPORTER": "none"}
    traced = otel(render(production_values()), "decode")
    assert traced["OTEL_TRACES_EXPORTER"] == "otlp" and traced["OTEL_SERVICE_NAME"] == "pdserve-decode"
    assert traced["OTEL_EXPORTER_OTLP_ENDPOINT"] == production_values()["tracing"]["endpoint"]


def test_replicas_are_set_per_role():
    rendered = render(production_values())
    replicas = {c: rendered.workload(c)["spec"]["replicas"] for c in COMPONENTS}
    assert replicas == {"gateway": 2, "prefill": 2, "decode": 4, "cache-store": 1}
    assert render({"decode": {"replicas": 0}}).workload("decode")["spec"]["replicas"] == 0


@pytest.mark.parametrize("values", [None, {"gateway": {"service": {"http": {"enabled": True, "port": 8080}}}},
                                    {"gateway": {"service": {"http": {"enabled": False}}}}])
def test_the_gateway_serves_openai_http_on_its_named_port(values):
    rendered = render(values)
    http = (values or {}).get("gateway", {}).get("service", {}).get("http", {"enabled": True, "port": 8000})
    container = rendered.container("gateway")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service_ports = {p["name"]: p for p in rendered.get("Service", rendered.workload("gateway")["metadata"]["name"])
                     ["spec"]["ports"]}
    listen = rendered.settings("gateway").get("PDSERVE_HTTP_LISTEN")
    if not http["enabled"]:
        assert (listen, "http" in ports, "http" in service_ports) == (None, False, False)
        return
    assert listen == f"0.0.0.0:{http['port']}" and ports["http"] == http["port"]
    assert (service_ports["http"]["port"], service_ports["http"]["targetPort"]) == (http["port"], "http")
    for component in set(COMPONENTS) - {"gateway"}:
        assert "PDSERVE_HTTP_LISTEN" not in rendered.settings(component)


def test_an_api_key_secret_is_mounted_as_the_gateways_key_file_and_nothing_else_sees_it():
    assert "PDSERVE_API_KEY_FILE" not in render().settings("gateway")  # no Secret named: open
    rendered = render({"gateway": {"apiKeySecret": {"name": "my-keys", "key": "keys.txt"}}})
    pod = rendered.workload("gateway")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "api-keys")
    assert volume["secret"] == {"secretName": "my-keys", "items": [{"key": "keys.txt", "path": "keys"}]}
    mount = next(m for m in rendered.container("gateway")["volumeMounts"] if m["name"] == "api-keys")
    assert mount["readOnly"] and "subPath" not in mount  # a rotated key reaches the file
    assert rendered.settings("gateway")["PDSERVE_API_KEY_FILE"] == f"{mount['mountPath']}/keys"
    for component in set(COMPONENTS) - {"gateway"}:
        assert "PDSERVE_API_KEY_FILE" not in rendered.settings(component)
        assert all(m["name"] != "api-keys" for m in rendered.container(component).get("volumeMounts", []))


def test_an_api_key_is_refused_in_a_configmap():
    with pytest.raises(helm.HelmValuesError, match="'api_key' not allowed"):  # it belongs in apiKeySecret
        render({"gateway": {"config": {"api_key": "sk-in-a-configmap"}}})
