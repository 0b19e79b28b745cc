"""Shared test settings. Sub-folders keep their own fixtures in their own conftest.py."""

import os

# jsii warns on every process start that Node.js 20 (these machines') is past its end of life;
# the warning is about the machine, not this project.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
