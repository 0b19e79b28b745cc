"""Reading a rendered boot script as the host does: its compressed bundle of files decoded, and the
files it writes from quoted heredocs (userdata/bootstrap.sh.j2)."""

from __future__ import annotations

import re

from neuron_serving.render.boot import unpacked

EMBEDDED_FILE = re.compile(r"^put (\S+) \d+ <<'EOF'\n(.*?)^EOF$", re.MULTILINE | re.DOTALL)
BUNDLE = re.compile(r"^files=\$\(python3 -c '[^\n]*' <<'EOF'\n(.*?)^EOF\n\)$", re.MULTILINE | re.DOTALL)


def unbundled(script: str) -> str:
    """``script`` with its compressed bundle of files decoded in place, as the host evaluates it."""
    [blob] = BUNDLE.findall(script)
    return script.replace(blob, unpacked(blob))


def embedded_files(script: str) -> dict[str, str]:
    """The files the script writes from quoted heredocs, in it or in its bundle, by their path on
    the host."""
    return dict(EMBEDDED_FILE.findall(unbundled(script)))
