"""Render ``charts/pdserve`` offline (helm-python-sdk: Helm's Go engine as a library, no binary, no
network, no cluster) and look things up in the manifests."""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pdserve"
PRODUCTION_VALUES = CHART / "ci" / "production-values.yaml"
RELEASE, NAMESPACE = "demo", "llm"
# values key → (component label, module the container runs)
ROLES = {"gateway": ("gateway", "services.gateway"), "prefill": ("prefill", "services.prefill_node"),
         "decode": ("decode", "services.decode_node"), "cacheStore": ("cache-store", "services.cache_store")}


def production_values() -> dict[str, Any]:
    return yaml.safe_load(PRODUCTION_VALUES.read_text())


@dataclass
class Rendered:
    """Every object a render produced, and the NOTES."""

    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def workload(self, component: str) -> dict[str, Any]:
        """The Deployment or StatefulSet of a component (by its pods' component label)."""
        found = [o for o in self.objects if o["kind"] in ("Deployment", "StatefulSet")
                 and o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == component]
        assert len(found) == 1, f"{component}: {len(found)} workloads"
        return found[0]

    def container(self, component: str) -> dict[str, Any]:
        (container,) = self.workload(component)["spec"]["template"]["spec"]["containers"]
        return container

    def settings(self, component: str) -> dict[str, str]:
        """What the component's process sees as PDSERVE_* variables: its ConfigMap, then its literal env."""
        container = self.container(component)
        variables: dict[str, str] = {}
        for source in container.get("envFrom", []):
            variables.update(self.get("ConfigMap", source["configMapRef"]["name"])["data"])
        variables.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
        return {k: v for k, v in variables.items() if k.startswith("PDSERVE_")}


def render(values: dict[str, Any] | None = None) -> Rendered:
    """Render with ``values`` over the chart's defaults (HelmValuesError/HelmRenderError on bad ones)."""
    return copy.deepcopy(_render(json.dumps(values, sort_keys=True) if values is not None else None))


@functools.cache
def _render(values_json: str | None) -> Rendered:
    values = json.loads(values_json) if values_json is not None else None
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    objects = [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
               for doc in yaml.safe_load_all(text) if doc]
    notes = next((text for path, text in manifests.items() if path.endswith("NOTES.txt")), "")
    return Rendered(objects, notes)
