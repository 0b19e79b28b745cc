"""docs/api.md is generated from the docstrings: it must match them."""

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_reference_matches_the_docstrings():
    generator = runpy.run_path(str(ROOT / "scripts" / "api_reference.py"))
    assert (ROOT / "docs" / "api.md").read_text() == generator["reference"](), \
        "run: python scripts/api_reference.py"


def test_the_guide_links_only_to_files_that_exist():
    guide = (ROOT / "docs" / "platform-teams.md").read_text()
    for target in ("../examples/team_template", "api.md", "../README.md"):
        assert f"]({target}" in guide
        assert (ROOT / "docs" / target).exists()
