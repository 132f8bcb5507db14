"""Wheels for running pdserve's GPU tests and ``bench-gpu`` on a machine that cannot reach a registry.

    python -m services.bench.gpu.bundle [--dest .whl] [--python 3.12] [--from DIR]

Downloads (``pip download --no-deps``, manylinux x86_64, for the target Python) flashinfer-python and what
it needs that a CUDA+PyTorch image lacks (apache-tvm-ffi), plus pdserve's runtime dependencies that such
an image usually lacks (gRPC extras, protobuf, OpenTelemetry, structlog, gguf, FastAPI...), at the versions
installed here. flashinfer-python's wheel (~62 MB) is then trimmed to ~30 MB: the CUDA sources of kernels
pdserve never compiles (every ``flashinfer/data/csrc/<subfolder>``) are left out; its headers (FlashInfer,
CUTLASS, CCCL, spdlog) and the top-level sources of the attention and page kernels stay, so its JIT
compiles what the FlashInfer backend uses. ``--from DIR`` takes wheels already downloaded there.
Where nvcc is found, the FlashInfer modules pdserve runs are then compiled here for sm_90a and added to
that wheel as AOT modules (``flashinfer_prebuild``; ``--no-prebuild`` skips it), so the GPU machine need
not compile them.
The device-machine commands are in kernels/README.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

FLASHINFER = ("flashinfer-python", "0.7.2.post1")
IMAGE_LACKS = [("apache-tvm-ffi", "0.1.15.post2")]
"""Pinned: what flashinfer-python imports that a CUDA image with PyTorch lacks."""
RUNTIME = ["grpcio", "grpcio-tools", "grpcio-health-checking", "grpcio-reflection", "protobuf", "structlog",
           "typing-extensions", "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-semantic-conventions",
           "opentelemetry-proto",
           "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-exporter-otlp-proto-common",
           "opentelemetry-exporter-otlp-common", "googleapis-common-protos", "gguf", "fastapi", "starlette",
           "pydantic", "pydantic-core", "annotated-types", "annotated-doc", "typing-inspection", "uvicorn",
           "pytest-asyncio"]
"""pdserve's runtime (and async test) dependencies, at the versions installed here (grpcio-tools: the
stubs are generated there, `python3 protos/generate.py`)."""
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]


def requirements() -> list[str]:
    pins = [FLASHINFER, *IMAGE_LACKS]
    pins += [(name, importlib.metadata.version(name)) for name in RUNTIME]
    return [f"{name}=={version}" for name, version in pins]


def download(requirement: str, dest: Path, python: str) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python, "--implementation", "cp", *platforms, "-d", str(dest), requirement],
                   check=True)


def trim_flashinfer(wheel: Path) -> Path:
    """Rewrite ``wheel`` in place without ``flashinfer/data/csrc/<subfolder>/...``. Returns it."""
    trimmed = wheel.with_suffix(".trimmed")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            parts = item.filename.split("/")
            if parts[:3] == ["flashinfer", "data", "csrc"] and len(parts) > 4:
                continue
            target.writestr(item, source.read(item))
    trimmed.replace(wheel)
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, default=Path(".whl"))
    parser.add_argument("--python", default="3.12", help="the device machine's Python (major.minor)")
    parser.add_argument("--from", dest="source", type=Path, help="copy wheels from here instead of downloading")
    parser.add_argument("--no-prebuild", action="store_true", help="leave FlashInfer's kernels to its JIT there")
    args = parser.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    for requirement in requirements():
        name = requirement.split("==")[0].replace("-", "_")
        if any(args.dest.glob(f"{name}-*.whl")):
            continue
        found = list(args.source.glob(f"{name}-*.whl")) if args.source else []
        if found:
            (args.dest / found[0].name).write_bytes(found[0].read_bytes())
        else:
            download(requirement, args.dest, args.python)
    for wheel in args.dest.glob("flashinfer_python-*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            untrimmed = any(n.count("/") > 3 and n.startswith("flashinfer/data/csrc/") for n in archive.namelist())
        if untrimmed:
            trim_flashinfer(wheel)
    if not args.no_prebuild:
        from services.bench.gpu.flashinfer_prebuild import PrebuildError, prebuild

        try:
            print(f"FlashInfer AOT modules in the wheel: {len(prebuild(args.dest))}")
        except PrebuildError as exc:
            print(f"FlashInfer modules not prebuilt: {exc}")
    total = sum(w.stat().st_size for w in args.dest.glob("*.whl"))
    print(f"{len(list(args.dest.glob('*.whl')))} wheels in {args.dest}: {total / 2**20:.1f} MiB "
          f"(the device tool carries at most 64 MiB with the working tree)")


if __name__ == "__main__":
    main()
