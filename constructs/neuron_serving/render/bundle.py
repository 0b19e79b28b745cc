"""The boot bundle: the files a host's boot writes (scripts, units, configs), as plain files with a
manifest of their checksums, which the stack ships as a CDK asset and the boot script downloads and
checks before it installs any of them (``userdata/bootstrap.sh.j2``).

The bundle is made at synth, so no file may hold a deploy-time value (a CDK token such as a bucket's
name): those reach the host through ``/etc/neuron-serving/stack.env``, which is in the user data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from ..plan.errors import ServingConfigError, problem

MANIFEST = "MANIFEST"
"""The bundle's list of files: ``<sha256>  <path>`` per file, as ``sha256sum`` prints and ``sha256sum -c``
reads them (GNU coreutils), sorted by path, with paths relative to ``/``. The user data carries its
own checksum, so a bundle altered anywhere (in the bucket, in transit) is refused as a whole."""

TOKEN_MARK = "${Token["
"""How aws-cdk-lib encodes an unresolved value in a string."""


def executable(text: str) -> bool:
    """Whether the host installs the file as a program (mode 755, else 644): it starts with ``#!``,
    as the boot script decides from the file's first two bytes."""
    return text.startswith("#!")


def manifest(files: Mapping[str, str]) -> str:
    """:data:`MANIFEST`'s text for ``files`` (host path to content), after checking each file.

    Raises :class:`ServingConfigError` naming a file that holds a CDK token, or whose path is not
    absolute and plain.
    """
    problems = []
    lines = []
    for path, text in sorted(files.items()):
        if not path.startswith("/") or ".." in path.split("/") or any(c.isspace() for c in path):
            problems.append(problem("bundle file", path, "must be an absolute path without spaces or '..'"))
        elif TOKEN_MARK in text:
            problems.append(problem(path, text[:60] + "...", "cannot hold a deploy-time value (a CDK token): "
                                    "the bundle is made at synth; the boot script passes those in stack.env"))
        lines.append(f"{hashlib.sha256(text.encode()).hexdigest()}  {path.lstrip('/')}\n")
    if problems:
        raise ServingConfigError(problems)
    return "".join(lines)


def digest(files: Mapping[str, str]) -> str:
    """The SHA-256 of ``files``' :data:`MANIFEST`, which the user data checks the downloaded bundle by."""
    return hashlib.sha256(manifest(files).encode()).hexdigest()


def write_bundle(files: Mapping[str, str], directory: Path) -> None:
    """Write ``files`` below ``directory`` at their host paths, with :data:`MANIFEST` at its top: the
    directory the stack's asset is made of, readable as is in the cloud assembly."""
    listing = manifest(files)
    for path, text in files.items():
        target = directory / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o755 if executable(text) else 0o644)
    (directory / MANIFEST).write_text(listing)
