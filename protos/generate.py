"""Generate the Python stubs of ``pdserve.v1`` into ``protos/python/pdserve/v1/`` (``make protos``).

Runs ``grpc_tools.protoc`` in-process on every ``protos/pdserve/v1/*.proto``: ``*_pb2.py`` (messages),
``*_pb2.pyi`` (their types) and ``*_pb2_grpc.py`` (stubs and servicers). The protos live under the
include root as ``pdserve/v1/...``, so generated modules import each other as ``pdserve.v1.x_pb2``.

Also writes ``protos/python/requirements.txt``: the grpcio and protobuf versions the generated code
needs at runtime (it refuses older ones), read by ``protos/python/pyproject.toml``.

Idempotent and fast: a digest of the inputs (protos, this script, the generator's versions) is kept in
``protos/python/.stamp``; when it matches and every output exists nothing runs. ``--force`` regenerates.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

PROTOS = Path(__file__).resolve().parent
SOURCE_DIR = PROTOS / "pdserve" / "v1"
PACKAGE_ROOT = PROTOS / "python"
OUT_DIR = PACKAGE_ROOT / "pdserve" / "v1"
STAMP = PACKAGE_ROOT / ".stamp"
REQUIREMENTS = PACKAGE_ROOT / "requirements.txt"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def expected_outputs(protos: list[Path]) -> list[Path]:
    return [OUT_DIR / f"{proto.stem}{suffix}" for proto in protos for suffix in SUFFIXES] + [REQUIREMENTS]


def inputs_digest(protos: list[Path]) -> str:
    digest = hashlib.sha256()
    digest.update(Path(__file__).read_bytes())
    for package in ("grpcio-tools", "protobuf"):
        digest.update(f"{package}=={version(package)}\n".encode())
    for proto in protos:
        digest.update(proto.name.encode() + b"\0" + proto.read_bytes() + b"\0")
    return digest.hexdigest()


def run_protoc(protos: list[Path], out: Path) -> None:
    from grpc_tools import protoc  # imported here so an up-to-date run stays fast

    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(proto.relative_to(PROTOS)) for proto in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {', '.join(p.name for p in protos)}")


def runtime_requirements(generated: Path) -> str:
    """grpcio >= the generator's version; protobuf >= the gencode's version, same major."""
    pb2 = next(generated.glob("*_pb2.py")).read_text()
    grpc_py = next(generated.glob("*_pb2_grpc.py")).read_text()
    protobuf = re.search(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", pb2, re.M)
    grpcio = re.search(r"^GRPC_GENERATED_VERSION = '([\d.]+)'", grpc_py, re.M)
    assert protobuf and grpcio, "generated code no longer states its runtime versions; update generate.py"
    major = int(protobuf.group(1))
    return (
        "# Written by protos/generate.py: the runtime versions the generated code accepts.\n"
        f"grpcio>={grpcio.group(1)}\n"
        f"protobuf>={'.'.join(protobuf.groups())},<{major + 1}\n"
    )


def generate(force: bool = False) -> bool:
    """Bring the stubs up to date; returns whether anything was regenerated."""
    protos = sorted(SOURCE_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {SOURCE_DIR}")
    digest = inputs_digest(protos)
    outputs = expected_outputs(protos)
    up_to_date = STAMP.exists() and STAMP.read_text().strip() == digest and all(p.exists() for p in outputs)
    if up_to_date and not force:
        return False
    with tempfile.TemporaryDirectory(prefix="pdserve-protos-") as tmp:
        run_protoc(protos, Path(tmp))
        generated = Path(tmp) / "pdserve" / "v1"
        requirements = runtime_requirements(generated)
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        for stale in OUT_DIR.iterdir():  # stubs of protos that were deleted or renamed
            if stale.name.endswith(SUFFIXES):
                stale.unlink()
        for path in generated.iterdir():
            shutil.copyfile(path, OUT_DIR / path.name)
    REQUIREMENTS.write_text(requirements)
    STAMP.write_text(digest + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--force", action="store_true", help="regenerate even when up to date")
    args = parser.parse_args(argv)
    changed = generate(force=args.force)
    print(f"protos: {'generated' if changed else 'up to date'} in {OUT_DIR.relative_to(PROTOS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
