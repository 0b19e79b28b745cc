"""Shared test settings. Sub-folders keep their own fixtures in their own conftest.py."""

import os

# jsii warns on every process start about the Node.js version; the warning is not ours to fix.
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
