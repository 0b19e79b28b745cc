"""docs/api.md is generated from the docstrings: it must match them."""

import os
import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_reference_matches_the_docstrings():
    generator = runpy.run_path(str(ROOT / "scripts" / "api_reference.py"))
    assert (ROOT / "docs" / "api.md").read_text() == generator["reference"](), \
        "run: python scripts/api_reference.py"


def test_the_guide_links_only_to_files_that_exist():
    guide = (ROOT / "docs" / "platform-teams.md").read_text()
    for target in ("../examples/team_template", "api.md", "configuration.md"):
        assert f"]({target}" in guide
        assert (ROOT / "docs" / target).exists()


# -- the README is a newcomer's page; depth lives in docs/, and every link there leads somewhere ----

DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", *DOCS]
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
# A Markdown link or image: ](target) or ](target "title"); the target has no spaces.
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, where a `#` starts a comment and `](` is no link."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slugs(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_` dropped,
    each space a `-`, and `-1`, `-2`... after a repeated one (github-slugger, which github.com
    follows)."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in prose(page.read_text()):
        heading = HEADING.match(line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(2).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def relative_links(page: Path) -> list[tuple[Path, str]]:
    """Each relative link of ``page`` (inline code left out) as the file it names and its anchor."""
    links = []
    for line in prose(page.read_text()):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if EXTERNAL.match(target):
                continue
            path, _, anchor = target.partition("#")
            links.append(((page.parent / path).resolve() if path else page, anchor))
    return links


def test_the_readme_is_shorter_than_300_lines():
    count = len((ROOT / "README.md").read_text().splitlines())
    assert count < 300, f"README.md has {count} lines: move depth into a docs/ page and link it"


def test_the_readme_links_every_docs_page():
    linked = {path for path, _ in relative_links(ROOT / "README.md")}
    assert [page.name for page in DOCS if page not in linked] == []


def test_every_relative_link_names_a_file_that_exists():
    broken = [f"{page.relative_to(ROOT)} -> {os.path.relpath(path, ROOT)}" for page in PAGES
              for path, _ in relative_links(page) if not path.exists()]
    assert broken == []


def test_every_anchor_into_a_markdown_page_names_one_of_its_headings():
    broken = [f"{page.relative_to(ROOT)} -> {path.relative_to(ROOT)}#{anchor}" for page in PAGES
              for path, anchor in relative_links(page)
              if anchor and path.suffix == ".md" and path.exists() and anchor not in slugs(path)]
    assert broken == []
