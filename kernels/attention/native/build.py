"""Compiles the attention kernels (``SOURCES``, ``HEADERS``) once per (sources, compiler, flags, CPU) into
one cached shared library and loads it with ctypes.

The library lives in ``$PDSERVE_CACHE_DIR/native`` (default ``~/.cache/pdserve/native``) under a name
that hashes everything that shapes the binary, so an edited source or another CPU gets its own file.
Each process compiles into a temporary file and renames it into place, so concurrent first uses are
safe. The compiler is ``$CC`` when set, else ``cc`` or ``gcc`` on ``PATH``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCES = tuple(Path(__file__).with_name(name) for name in ("paged_decode.c", "prefill_fixed.c",
                                                                    "prefill_fp32.c", "prefill_bf16.c", "gemm_amx.c",
                                                                    "gemm_int4.c"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("numerics.h", "prefill_fixed.h", "gemm_int4_amx.h"))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared")
LIBS = ("-lm",)
COMPILE_TIMEOUT_S = 120


class NativeBuildError(RuntimeError):
    """The native kernels cannot be built or loaded here (no compiler, a compile error, a bad library)."""


def cache_dir() -> Path:
    return Path(os.environ.get("PDSERVE_CACHE_DIR", Path.home() / ".cache" / "pdserve")) / "native"


def find_compiler() -> str:
    """``$CC`` if set (it must exist), else ``cc`` or ``gcc`` found on ``PATH``."""
    requested = os.environ.get("CC")
    if requested:
        found = shutil.which(requested)
        if found is None:
            raise NativeBuildError(f"C compiler $CC={requested!r} not found")
        return found
    for name in ("cc", "gcc"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise NativeBuildError("no C compiler: neither cc nor gcc is on PATH (set CC to use another)")


@functools.cache
def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        return os.uname().machine


@functools.cache
def _source_digest() -> bytes:
    digest = hashlib.sha256()
    for path in SOURCES + HEADERS:
        try:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        except OSError as exc:
            raise NativeBuildError(f"kernel source {path} is unreadable: {exc}") from exc
    return digest.digest()


def library_path(compiler: str) -> Path:
    """Where the library built by ``compiler`` lives: named by a hash of the source, the compiler's
    resolved path, the flags and the CPU's feature flags (``-march=native`` depends on them)."""
    digest = hashlib.sha256(_source_digest())
    for part in (os.path.realpath(compiler), " ".join(FLAGS + LIBS), _cpu_signature()):
        digest.update(b"\0" + part.encode())
    return cache_dir() / f"attention-{digest.hexdigest()[:16]}.so"


def compile_library(compiler: str, target: Path) -> None:
    """Builds the library into a temporary file beside ``target``, then renames it into place."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=".so")
        os.close(fd)
    except OSError as exc:
        raise NativeBuildError(f"cannot write into the kernel cache {target.parent}: {exc}") from exc
    command = [compiler, *FLAGS, "-o", temp, *map(str, SOURCES), *LIBS]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if result.returncode != 0:
            raise NativeBuildError(
                f"{' '.join(command)} exited with {result.returncode}:\n{result.stderr.strip()[-4000:]}"
            )
        os.chmod(temp, 0o755)  # mkstemp made it private
        os.replace(temp, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"{' '.join(command)} failed: {exc}") from exc
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


_loaded: dict[Path, ctypes.CDLL | NativeBuildError] = {}


def native_function(name: str, argtypes: list, restype=ctypes.c_int):
    """Function ``name`` of the compiled kernels with its C signature set, or None where they cannot be built
    or loaded here."""
    try:
        function = getattr(load_library(), name)
    except NativeBuildError:
        return None
    function.argtypes, function.restype = argtypes, restype
    return function


def load_library() -> ctypes.CDLL:
    """The compiled kernels (built on first use); raises ``NativeBuildError`` saying why not. A failed
    build or load is remembered per library path: it is attempted once per process."""
    compiler = find_compiler()
    path = library_path(compiler)
    cached = _loaded.get(path)
    if isinstance(cached, NativeBuildError):
        raise cached
    if cached is not None:
        return cached
    try:
        if not path.exists():
            compile_library(compiler, path)
        try:
            library = ctypes.CDLL(str(path))
        except OSError as exc:
            raise NativeBuildError(f"loading {path} failed: {exc}") from exc
    except NativeBuildError as exc:
        _loaded[path] = exc
        raise
    _loaded[path] = library
    return library
