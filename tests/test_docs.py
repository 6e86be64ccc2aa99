"""The README and docs/: every relative link and #anchor resolves, every figure shown is committed, and the
README stays a short page (at most 300 lines; the rest lives in docs/)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    found = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading and not in_code:
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_readme_is_short_and_docs_exist():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300
    assert len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_and_anchors_resolve(page):
    broken = []
    for link in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", link):
            continue                                            # http(s), mailto: not checked offline
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: no heading with that anchor in {path.name}")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"
