"""FlashInfer modules compiled ahead of time for the GPU bundle.

    python -m services.bench.gpu.flashinfer_prebuild [--bundle .whl] [--arch 9.0a]

Compiles here, with nvcc and no GPU, the FlashInfer modules pdserve runs
(``services.bench.gpu.flashinfer_aot_build``), for the lent GPU's architecture (sm_90a: H100 and H200), and
adds them to the bundle's flashinfer wheel as FlashInfer AOT modules
(``flashinfer/data/aot/<name>/<name>.so``). FlashInfer loads such a module before it would compile one;
if it does not load there, FlashInfer compiles it as before. This saves the GPU machine's JIT minutes, and
it shows here, before any device time is spent, that the trimmed wheel's sources compile.

``gpu.bundle`` calls this when nvcc is found. Needs gcc (a link-only libcuda stub: the modules load the
real driver on the GPU machine) and a registry for what flashinfer imports here (pip, into a scratch
folder; nothing is installed into the environment).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

AOT_PREFIX = "flashinfer/data/aot/"
FLASHINFER_IMPORTS = ["nvidia-ml-py", "einops", "tabulate", "tqdm", "ninja", "cuda-bindings"]
"""What ``import flashinfer`` needs beyond torch and numpy (the GPU machine's image has them)."""
CURAND_HEADERS = "nvidia-curand==10.4.5.25"
"""``curand_kernel.h`` for the fa3 sources (CUTLASS's utilities include it) and the norm module, where the
toolkit here lacks it: the CUDA 13 wheel puts it in ``nvidia/cu13/include``."""
CUBLAS_HEADERS = "nvidia-cublas==13.10.0.20"
"""``cublasLt.h`` for the norm module (its TensorRT-LLM utilities include it), where the toolkit here lacks it;
only the wheel's ``nvidia/cu13/include`` is unpacked (the rest is ~450 MB of libraries nothing links here)."""
REPO_ROOT = Path(__file__).resolve().parents[2]


class PrebuildError(RuntimeError):
    pass


def cuda_home() -> Path | None:
    """``$CUDA_HOME``, the toolkit of the nvcc on the path, or /usr/local/cuda: the first with nvcc and the
    runtime library."""
    candidates = [os.environ.get("CUDA_HOME", "")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    candidates.append("/usr/local/cuda")
    for home in filter(None, candidates):
        if (Path(home) / "bin" / "nvcc").exists() and any((Path(home) / "lib64").glob("libcudart.so*")):
            return Path(home)
    return None


def aot_modules(wheel: Path) -> list[str]:
    """Names of the AOT modules already in ``wheel``."""
    with zipfile.ZipFile(wheel) as archive:
        return sorted({n[len(AOT_PREFIX):].split("/")[0] for n in archive.namelist() if n.startswith(AOT_PREFIX)})


def unpack_headers(requirement: str, site: Path, downloads: Path) -> None:
    """Only the ``nvidia/cu13/include`` headers of ``requirement``'s wheel, into ``site``."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                    "-d", str(downloads), requirement], check=True)
    with zipfile.ZipFile(next(downloads.glob("*.whl"))) as archive:
        archive.extractall(site, [n for n in archive.namelist() if n.startswith("nvidia/cu13/include/")])


def compile_modules(wheel: Path, tvm_ffi: str, arch: str, scratch: Path) -> dict[str, Path]:
    """Compile every module of ``flashinfer_aot_build`` in ``scratch``; returns {name: .so path}."""
    home = cuda_home()
    if home is None:
        raise PrebuildError("no CUDA toolkit (nvcc and libcudart) here; the GPU machine will JIT-compile instead")
    site, stubs, out = scratch / "site", scratch / "stubs", scratch / "built.json"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(site)]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True)
    subprocess.run([*pip, tvm_ffi, *FLASHINFER_IMPORTS, CURAND_HEADERS], check=True)
    unpack_headers(CUBLAS_HEADERS, site, scratch / "downloads")
    stubs.mkdir()
    (stubs / "stub.c").write_text("")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stubs / "libcuda.so"),
                    str(stubs / "stub.c")], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT)]),
           "PATH": os.pathsep.join([str(site / "bin"), str(home / "bin"), os.environ.get("PATH", "")]),
           "CUDA_HOME": str(home), "LIBRARY_PATH": os.pathsep.join([str(stubs), str(home / "lib64")]),
           "CPATH": str(site / "nvidia" / "cu13" / "include"), "FLASHINFER_CUDA_ARCH_LIST": arch,
           "FLASHINFER_WORKSPACE_BASE": str(scratch / "ws"), "MAX_JOBS": str(os.cpu_count() or 2)}
    subprocess.run([sys.executable, "-m", "services.bench.gpu.flashinfer_aot_build", str(out)], env=env, check=True,
                   cwd=scratch)
    return {name: Path(path) for name, path in json.loads(out.read_text()).items()}


def add_to_wheel(wheel: Path, modules: dict[str, Path]) -> None:
    """Rewrite ``wheel`` with each module at ``flashinfer/data/aot/<name>/<name>.so``, listed in RECORD."""
    rewritten = wheel.with_suffix(".aot")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as target:
        record_name = next(n for n in source.namelist() if n.endswith(".dist-info/RECORD"))
        record = source.read(record_name).decode().rstrip("\n").split("\n")
        for item in source.infolist():
            if item.filename != record_name:
                target.writestr(item, source.read(item))
        for name, path in sorted(modules.items()):
            data = path.read_bytes()
            arcname = f"{AOT_PREFIX}{name}/{name}.so"
            info = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = 0o755 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            target.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arcname},sha256={digest},{len(data)}")
        target.writestr(record_name, "\n".join(record) + "\n")
    rewritten.replace(wheel)


def prebuild(bundle: Path, arch: str = "9.0a") -> list[str]:
    """Add the compiled modules to the flashinfer wheel in ``bundle``, unless it has them already.
    Returns the module names in the wheel; raises :class:`PrebuildError` when nothing could be compiled."""
    from services.bench.gpu.bundle import IMAGE_LACKS

    wheel = next(bundle.glob("flashinfer_python-*.whl"), None)
    if wheel is None:
        raise PrebuildError(f"no flashinfer wheel in {bundle}")
    if present := aot_modules(wheel):
        return present
    tvm_ffi = next(f"{name}=={version}" for name, version in IMAGE_LACKS if name == "apache-tvm-ffi")
    with tempfile.TemporaryDirectory(prefix="pdserve-fi-aot-") as scratch:
        modules = compile_modules(wheel, tvm_ffi, arch, Path(scratch))
        add_to_wheel(wheel, modules)
    return aot_modules(wheel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path(".whl"))
    parser.add_argument("--arch", default="9.0a", help="FLASHINFER_CUDA_ARCH_LIST (9.0a: H100, H200)")
    args = parser.parse_args()
    try:
        names = prebuild(args.bundle, args.arch)
    except PrebuildError as exc:
        raise SystemExit(str(exc)) from exc
    print(f"{len(names)} FlashInfer AOT modules in the bundle's flashinfer wheel")


if __name__ == "__main__":
    main()
