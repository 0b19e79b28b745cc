"""Shared by the stub executables: record each call, read the knobs tests set in the environment.

Every stub appends its name and argv as one JSON line to ``$STUB_CALLS``. Counters (for "fail
the first N times") live in ``$STUB_STATE``.

Imitates no upstream tool: each stub's own docstring names the tool, version and documentation it
imitates, and what of it is unverified.
"""

import fcntl
import json
import os
import sys
from pathlib import Path

FAKE_HF_TOKEN = "hf_StubTokenNeverToBeLogged0123456789"
"""What the test's Secrets Manager holds as the Hugging Face token (tests/boot/conftest.py, `aws`); tests search for it
everywhere it must not be."""


def record() -> list[str]:
    name = os.path.basename(sys.argv[0])
    line = json.dumps({"cmd": name, "argv": sys.argv[1:]}) + "\n"
    with open(os.environ["STUB_CALLS"], "a", encoding="utf-8") as calls:
        calls.write(line)
    return sys.argv[1:]


def knob(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def count(name: str) -> int:
    """How many times this counter has been bumped, including this time."""
    path = Path(os.environ["STUB_STATE"]) / name
    with open(path, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read() or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(str(n))
    return n
