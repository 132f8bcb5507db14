"""``pip install protos/python`` works from a fresh clone: only the tracked files of ``protos/`` (no generated
stubs, no requirements.txt), built into a wheel that carries every stub and the runtime requirements."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_client_package_builds_from_tracked_files_only(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "protos"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert not any(name.endswith("_pb2.py") for name in tracked), "stubs are generated, never committed"
    for name in tracked:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, tmp_path / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(tmp_path / "protos" / "python")], check=True, timeout=300)
    (wheel,) = wheels.glob("pdserve_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    protos = sorted(p.stem for p in (REPO / "protos" / "pdserve" / "v1").glob("*.proto"))
    for stem in protos:
        assert {f"pdserve/v1/{stem}_pb2.py", f"pdserve/v1/{stem}_pb2_grpc.py"} <= names, stem
    assert "Requires-Dist: grpcio>=" in metadata and "Requires-Dist: protobuf" in metadata, metadata
