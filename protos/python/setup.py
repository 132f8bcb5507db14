"""Builds pdserve-client from a fresh clone: the stubs are generated (``../generate.py``) before setuptools
reads the package, so ``pip install protos/python`` works without ``make protos`` first (they are never
committed). An sdist, which carries them, has no ``../generate.py`` and builds as it is."""

import runpy
from pathlib import Path

from setuptools import setup

GENERATOR = Path(__file__).resolve().parent.parent / "generate.py"

if GENERATOR.is_file():
    runpy.run_path(str(GENERATOR))["generate"]()
setup()
