"""Builds the library's wheel from a copy of the repository's sources, offline."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(directory: Path) -> Path:
    """The wheel of the sources, built in ``directory`` (from a copy: setuptools leaves a build/
    folder next to the sources it builds)."""
    source = directory / "src"
    for folder in ("constructs", "userdata"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(directory), str(source)], check=True, capture_output=True)
    (wheel,) = directory.glob("cdk_neuron_serving-*.whl")
    return wheel
