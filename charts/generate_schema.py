"""Write ``charts/pdserve/values.schema.json`` (``make chart-schema``; ``--check`` only compares).

The chart's values are checked by this JSON schema on every ``helm install/upgrade/template/lint``. Each
role's ``config`` map lists exactly the settings of that service's config dataclass (a typo such as
``max_num_seq`` is refused, with its JSON type), and the global ``config`` the settings every service
has. Settings the chart derives from the pod (``listen``, ``metrics_listen``, ``advertise``,
``port_file``, ``http_listen``, ``health_listen``, ``admin_listen``) and from its Secrets (``mtls_dir``,
``insecure``: ``tls.internal``; ``tls_cert``, ``tls_key``: ``gateway.tls``) are left out: they come from
container env, which wins over the ConfigMap. So is ``api_key``: a key belongs in a Secret
(``gateway.apiKeySecret``), never in a ConfigMap.

The schema follows the code: ``tests/charts`` fails when this file would write something else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "charts" / "pdserve" / "values.schema.json"
POD_SETTINGS = frozenset({"listen", "metrics_listen", "advertise", "port_file", "http_listen",
                          "health_listen", "admin_listen", "mtls_dir", "insecure", "tls_cert", "tls_key",
                          "api_key"})
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "string"}


def role_configs() -> dict[str, type]:
    """Values key → the config dataclass of the service that role runs."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from services.cache_store.config import CacheStoreConfig
    from services.decode_node.config import DecodeNodeConfig
    from services.gateway.config import GatewayConfig
    from services.prefill_node.config import PrefillNodeConfig

    return {"gateway": GatewayConfig, "prefill": PrefillNodeConfig, "decode": DecodeNodeConfig,
            "cacheStore": CacheStoreConfig}


def settings_of(cls: type) -> dict[str, list[str]]:
    """Setting name → its JSON types (``X | None`` adds null), for every init field the chart may set."""
    hints = typing.get_type_hints(cls)
    settings: dict[str, list[str]] = {}
    for field in dataclasses.fields(cls):
        if not field.init or field.name in POD_SETTINGS:
            continue
        annotation, nullable = hints[field.name], False
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
            nullable = True
        settings[field.name] = [JSON_TYPES[annotation], *(["null"] if nullable else [])]
    return settings


def config_schema(settings: dict[str, list[str]]) -> dict[str, Any]:
    properties = {name: {"type": kinds[0] if len(kinds) == 1 else kinds} for name, kinds in sorted(settings.items())}
    return {"type": ["object", "null"], "additionalProperties": False, "properties": properties}


def obj(properties: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """An object schema; with ``properties`` no other key is allowed, without it anything is."""
    if properties is None:
        return {"type": "object", **extra}
    return {"type": "object", "additionalProperties": False, "properties": properties, **extra}


STRING, BOOLEAN, LIST, ANY_OBJECT = {"type": "string"}, {"type": "boolean"}, {"type": "array"}, obj()
COUNT = {"type": "integer", "minimum": 0}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
INT_OR_PERCENT = {"type": ["integer", "string"]}
QUANTITY = {"type": ["string", "integer"]}
TARGET = {"type": "number", "minimum": 0}
DURATION = {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}


def kubernetes_list(*required: str) -> dict[str, Any]:
    """A list of Kubernetes objects (EnvVar, Volume, …): each an object with ``required`` keys, any others."""
    return {"type": "array", "items": {"type": "object", "required": list(required)}}


# Escape hatches, global and per role: Kubernetes-shaped objects, checked only for the keys they must have.
EXTRAS = {"extraEnv": kubernetes_list("name"), "extraVolumes": kubernetes_list("name"),
          "extraVolumeMounts": kubernetes_list("name", "mountPath")}
PEERS = kubernetes_list()


def autoscaling_schema(*targets: str) -> dict[str, Any]:
    """A role's scaler (HPA or KEDA), its bounds and its targets (0 = not used)."""
    replicas = {"type": "integer", "minimum": 1}
    return obj({"hpa": obj({"enabled": BOOLEAN}), "keda": obj({"enabled": BOOLEAN}), "minReplicas": replicas,
                "maxReplicas": replicas, "targets": obj({name: TARGET for name in targets}), "behavior": ANY_OBJECT})


ENGINE_TARGETS = ("requestsWaiting", "kvUsage", "ttftSeconds", "cpuUtilization")


def role_schema(config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return obj({
        "replicas": COUNT, "config": config, "resources": ANY_OBJECT, "preStopSleepSeconds": COUNT,
        "startupProbe": obj({"periodSeconds": {"type": "integer", "minimum": 1},
                             "failureThreshold": {"type": "integer", "minimum": 1}}),
        "pdb": obj({"enabled": BOOLEAN, "minAvailable": {"type": ["integer", "string", "null"]},
                    "maxUnavailable": {"type": ["integer", "string", "null"]}}),
        "nodeSelector": ANY_OBJECT, "tolerations": LIST, "affinity": ANY_OBJECT, "topologySpreadConstraints": LIST,
        "podAnnotations": ANY_OBJECT, "podLabels": ANY_OBJECT, **EXTRAS, **extra,
    })


def values_schema() -> dict[str, Any]:
    roles = {key: settings_of(cls) for key, cls in role_configs().items()}
    common = {name: kinds for name, kinds in roles["gateway"].items()
              if all(other.get(name) == kinds for other in roles.values())}
    gpu = {"gpu": COUNT, "gpuResource": STRING}
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "pdserve chart values (generated by charts/generate_schema.py)",
        **obj({
            "image": obj({"repository": STRING, "tag": STRING,
                          "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}}),
            "imagePullSecrets": LIST, "nameOverride": STRING, "fullnameOverride": STRING, "clusterDomain": STRING,
            "serviceAccount": obj({"create": BOOLEAN, "name": STRING, "annotations": ANY_OBJECT}),
            "ports": obj({"grpc": PORT, "health": PORT, "metrics": PORT, "admin": PORT}),
            "tls": _tls(),
            "model": obj({"source": {"enum": ["bundled", "path"]}, "path": STRING, "mountPath": STRING,
                          "volume": ANY_OBJECT, "servedModelName": STRING, "maxModelLen": COUNT,
                          "deterministic": BOOLEAN,
                          "init": obj({"enabled": BOOLEAN, "image": STRING,
                                       "pullPolicy": {"enum": ["", "Always", "IfNotPresent", "Never"]},
                                       "fromPath": STRING, "fromClaim": STRING, "claimSubPath": STRING,
                                       "sizeLimit": QUANTITY, "resources": ANY_OBJECT})}),
            "config": config_schema(common),
            "tracing": obj({"exporter": {"enum": ["none", "otlp", "console"]}, "endpoint": STRING,
                            "protocol": {"enum": ["grpc", "http/protobuf", "http/json"]}, "sampler": STRING,
                            "samplerArg": STRING, "env": ANY_OBJECT}),
            "podAnnotations": ANY_OBJECT, "podLabels": ANY_OBJECT, "podSecurityContext": ANY_OBJECT,
            "securityContext": ANY_OBJECT, "tmpSizeLimit": QUANTITY, "terminationMarginSeconds": COUNT,
            "metricsAnnotations": BOOLEAN, **EXTRAS,
            "serviceMonitor": obj({"enabled": BOOLEAN, "interval": DURATION, "scrapeTimeout": DURATION,
                                   "labels": ANY_OBJECT}),
            "autoscaling": _autoscaling(),
            "networkPolicy": obj({"enabled": BOOLEAN, "gatewayFrom": PEERS, "adminFrom": PEERS,
                                  "metricsFrom": PEERS, "extraIngress": PEERS}),
            "gateway": role_schema(config_schema(roles["gateway"]), strategy=ANY_OBJECT, service=obj({
                "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}, "annotations": ANY_OBJECT,
                "http": obj({"enabled": BOOLEAN, "port": PORT})}),
                apiKeySecret=obj({"name": STRING, "key": {"type": "string", "minLength": 1}}),
                tls=obj({"secretName": STRING}),
                autoscaling=autoscaling_schema("requestsInFlight", "cpuUtilization")),
            "prefill": role_schema(config_schema(roles["prefill"]), strategy=ANY_OBJECT,
                                   autoscaling=autoscaling_schema(*ENGINE_TARGETS), **gpu),
            "decode": role_schema(config_schema(roles["decode"]), strategy=ANY_OBJECT,
                                  autoscaling=autoscaling_schema(*ENGINE_TARGETS), **gpu),
            "cacheStore": _cache_store(roles),
        }),
    }


def _tls() -> dict[str, Any]:
    secret_names = obj({key: STRING for key in ("gateway", "prefill", "decode", "cacheStore")})
    issuer = obj({"name": STRING, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": STRING})
    cert_manager = obj({"enabled": BOOLEAN, "issuerRef": issuer, "duration": STRING, "renewBefore": STRING,
                        "admin": BOOLEAN})
    return obj({"internal": obj({"enabled": BOOLEAN, "secretNames": secret_names, "certManager": cert_manager})})


def _autoscaling() -> dict[str, Any]:
    keda = obj({"serverAddress": STRING, "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": COUNT, "authenticationRef": STRING})
    quantile = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}
    return obj({"ttftQuantile": quantile, "ttftWindow": DURATION, "prometheusAdapterRules": BOOLEAN, "keda": keda})


def _cache_store(roles: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    schema = role_schema(
        config_schema(roles["cacheStore"]), enabled=BOOLEAN, updateStrategy=ANY_OBJECT,
        disk=obj({"enabled": BOOLEAN, "mountPath": STRING, "sizeLimit": QUANTITY, "persistence": obj({
            "enabled": BOOLEAN, "size": QUANTITY, "storageClassName": STRING, "accessModes": LIST})}))
    schema["properties"]["replicas"] = {"type": "integer", "minimum": 0, "maximum": 1}
    return schema


def render() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the schema on disk is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = SCHEMA.read_text() if SCHEMA.exists() else ""
        if current != text:
            print(f"{SCHEMA.relative_to(REPO)} is out of date: run make chart-schema", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(text)
    print(f"wrote {SCHEMA.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
