"""The GPU bundle's prebuilt FlashInfer modules: how they go into the flashinfer wheel (the compile itself
needs nvcc and the 62 MB wheel, so it runs in ``gpu.bundle``, not here)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from services.bench.gpu.flashinfer_prebuild import AOT_PREFIX, PrebuildError, add_to_wheel, aot_modules, prebuild

DIST_INFO = "flashinfer_python-0.0.1.dist-info"


def fake_wheel(folder: Path) -> Path:
    """A minimal valid wheel named like flashinfer's: one module, METADATA, WHEEL, RECORD."""
    wheel = folder / "flashinfer_python-0.0.1-py3-none-any.whl"
    files = {"flashinfer/__init__.py": b"VERSION = 1\n",
             f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.0.1\n",
             f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in files.items()]
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{DIST_INFO}/RECORD", "\n".join([*record, f"{DIST_INFO}/RECORD,,"]) + "\n")
    return wheel


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_modules_land_in_the_aot_folder_listed_in_record_and_pip_installs_them(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    assert aot_modules(wheel) == []
    modules = {}
    for name, payload in (("page", b"\x7fELF page"), ("batch_prefill_x", b"\x7fELF prefill" * 100)):
        modules[name] = tmp_path / f"{name}.so"
        modules[name].write_bytes(payload)
    add_to_wheel(wheel, modules)

    assert aot_modules(wheel) == ["batch_prefill_x", "page"]
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read(f"{DIST_INFO}/RECORD").decode().splitlines()
        assert archive.read("flashinfer/__init__.py") == b"VERSION = 1\n"
        for name, path in modules.items():
            arcname = f"{AOT_PREFIX}{name}/{name}.so"
            assert archive.read(arcname) == path.read_bytes()
            assert f"{arcname},sha256={_digest(path.read_bytes())},{path.stat().st_size}" in record
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True)
    assert (site / "flashinfer/data/aot/page/page.so").read_bytes() == b"\x7fELF page"


def test_a_wheel_that_has_its_modules_is_left_as_it_is(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path)
    (tmp_path / "page.so").write_bytes(b"so")
    add_to_wheel(wheel, {"page": tmp_path / "page.so"})
    before = wheel.read_bytes()
    assert prebuild(tmp_path) == ["page"]  # nothing compiled: no nvcc, pip or network touched
    assert wheel.read_bytes() == before


def test_a_bundle_without_flashinfer_says_so(tmp_path: Path) -> None:
    with pytest.raises(PrebuildError, match="no flashinfer wheel"):
        prebuild(tmp_path)
