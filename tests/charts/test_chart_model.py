"""The chart's model: ``model.path`` (and the served name, the context length) reach every process that
loads the model as its own settings; ``model.init`` adds an init container that copies the files into the
model volume, from an image or a PVC, and the copy it runs works."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import helm_python as helm
import pytest
from kubernetes_validate import utils as kubernetes

from services.common.config import build_config
from tests.charts.chart import render
from tests.charts.test_chart_behaviour import COMPONENTS, config_classes

MODEL_ROLES = ["gateway", "prefill", "decode"]
OWN = {"source": "path", "path": "my-llama", "servedModelName": "mine", "maxModelLen": 4096}
FROM_IMAGE = {**OWN, "init": {"enabled": True, "image": "registry.example.com/models/my-llama:1"}}
FROM_CLAIM = {**OWN, "init": {"enabled": True, "fromClaim": "model-store", "claimSubPath": "llama/v1"}}


def pod(rendered, component: str) -> dict:
    return rendered.workload(component)["spec"]["template"]["spec"]


def test_the_model_its_served_name_and_context_length_reach_every_process_that_loads_it():
    rendered = render({"model": OWN})
    classes = config_classes()
    for component in MODEL_ROLES:
        settings = rendered.settings(component)
        assert settings["PDSERVE_MODEL"] == "/models/my-llama" and settings["PDSERVE_MAX_MODEL_LEN"] == "4096"
        config = build_config(classes[component], [], env=settings)  # what the process will run with
        assert str(config.model) == "/models/my-llama" and config.max_model_len == 4096
    assert build_config(classes["gateway"], [], env=rendered.settings("gateway")).served_model_name == "mine"
    assert "PDSERVE_SERVED_MODEL_NAME" not in rendered.settings("prefill")
    assert not {"PDSERVE_MODEL", "PDSERVE_MAX_MODEL_LEN"} & set(rendered.settings("cache-store"))


def test_a_roles_own_config_wins_over_the_model_values():
    rendered = render({"model": OWN, "gateway": {"config": {"served_model_name": "theirs"}},
                       "decode": {"config": {"max_model_len": 1024}}})
    assert rendered.settings("gateway")["PDSERVE_SERVED_MODEL_NAME"] == "theirs"
    assert rendered.settings("decode")["PDSERVE_MAX_MODEL_LEN"] == "1024"
    assert rendered.settings("prefill")["PDSERVE_MAX_MODEL_LEN"] == "4096"


def test_model_deterministic_sets_the_mode_of_the_gateway_and_every_node_together():
    classes = config_classes()
    rendered = render({"model": {"deterministic": True}})
    for component in MODEL_ROLES:
        assert build_config(classes[component], [], env=rendered.settings(component)).deterministic is True
    assert "PDSERVE_DETERMINISTIC" not in rendered.settings("cache-store")
    default = render()
    for component in MODEL_ROLES:
        assert build_config(classes[component], [], env=default.settings(component)).deterministic is False


def test_without_init_no_pod_has_an_init_container():
    for values in (None, {"model": OWN}):
        rendered = render(values if values is None else {"model": values["model"]})
        assert all("initContainers" not in pod(rendered, c) for c in COMPONENTS)


def test_init_from_an_image_copies_into_an_empty_dir_every_model_pod_mounts_read_only():
    rendered = render({"model": FROM_IMAGE})
    for component in MODEL_ROLES:
        spec = pod(rendered, component)
        (init,) = spec["initContainers"]
        assert init["name"] == "model-init" and init["image"] == "registry.example.com/models/my-llama:1"
        assert {e["name"]: e["value"] for e in init["env"]} == {"MODEL_SOURCE": "/model", "MODEL_DEST": "/models"}
        assert init["volumeMounts"] == [{"name": "model", "mountPath": "/models"}]  # writable, for the copy
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
        (volume,) = [v for v in spec["volumes"] if v["name"] == "model"]
        assert volume == {"name": "model", "emptyDir": {"sizeLimit": "20Gi"}}
        (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "model"]
        assert mount == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert "initContainers" not in pod(rendered, "cache-store")


def test_init_from_a_claim_mounts_it_read_only_and_copies_with_the_pdserve_image():
    rendered = render({"model": FROM_CLAIM})
    for component in MODEL_ROLES:
        spec = pod(rendered, component)
        (init,) = spec["initContainers"]
        assert init["image"] == rendered.container(component)["image"]
        assert {"name": "model-source", "mountPath": "/model", "readOnly": True, "subPath": "llama/v1"} in \
            init["volumeMounts"]
        (source,) = [v for v in spec["volumes"] if v["name"] == "model-source"]
        assert source["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}


def test_init_fills_a_given_volume_instead_of_an_empty_dir():
    rendered = render({"model": {**FROM_IMAGE, "volume": {"hostPath": {"path": "/data/models",
                                                                        "type": "DirectoryOrCreate"}}}})
    (volume,) = [v for v in pod(rendered, "decode")["volumes"] if v["name"] == "model"]
    assert volume == {"name": "model", "hostPath": {"path": "/data/models", "type": "DirectoryOrCreate"}}


@pytest.mark.parametrize("model", [FROM_IMAGE, FROM_CLAIM])
def test_the_init_renders_validate_against_the_kubernetes_schema(model):
    for obj in render({"model": model}).objects:
        kubernetes.validate(obj, kubernetes.latest_version(), strict=True)


@pytest.mark.parametrize(("model", "complaint"), [
    ({**OWN, "init": {"enabled": True}}, "model.init.enabled needs model.init.image"),
    ({"source": "bundled", "init": {"enabled": True, "image": "x"}}, "model.init.enabled needs model.source=path"),
])
def test_an_init_without_a_source_fails_the_render(model, complaint):
    with pytest.raises(helm.HelmRenderError, match=complaint):
        render({"model": model})


@pytest.mark.parametrize(("model", "complaint"), [
    ({"init": {"enabled": True, "fromClame": "x"}}, "'fromClame' not allowed"),
    ({"maxModelLen": -1}, "maxModelLen"),
    ({"deterministic": "yes"}, "deterministic"),
])
def test_mistyped_model_values_fail_naming_the_key(model, complaint):
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render({"model": model})


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_the_init_copy_copies_once_and_finishes_an_interrupted_copy(tmp_path):
    (init,) = pod(render({"model": FROM_IMAGE}), "prefill")["initContainers"]
    source, dest = tmp_path / "image" / "model", tmp_path / "volume"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "sub" / "model.safetensors").write_bytes(b"weights")
    (source / "config.json").chmod(stat.S_IRUSR)  # read-only files, as in an image or a PVC
    dest.mkdir()
    (dest / "config.json").write_text("partial")  # a copy cut short by a restart: no marker yet
    (dest / "config.json").chmod(stat.S_IRUSR)  # `cp -f` overwrites it as uid 10001 (as root nothing bites)

    def copy() -> str:
        env = {**os.environ, "MODEL_SOURCE": str(source), "MODEL_DEST": str(dest)}
        return subprocess.run(init["command"], env=env, capture_output=True, text=True, check=True).stdout

    assert "copying the model" in copy()
    assert (dest / "config.json").read_text() == "{}"
    assert (dest / "sub" / "model.safetensors").read_bytes() == b"weights"
    assert (dest / ".pdserve-model-copied").exists()
    (source / "sub" / "model.safetensors").write_bytes(b"changed")
    assert "model already in" in copy()
    assert (dest / "sub" / "model.safetensors").read_bytes() == b"weights"
