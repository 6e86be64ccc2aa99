"""The README and docs/: every relative link and #anchor resolves, every figure shown is committed, and the
README stays a short page (at most 300 lines; the rest lives in docs/)."""

import importlib
import re
from pathlib import Path

import pytest

from common import _moved, registry

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


ENGINE_PAGE = REPO / "docs" / "engine.md"


def moved_modules() -> dict[str, str]:
    """Old module path -> new one: the finder's table (common/_moved.py), with the lines each registered
    application's package adds when it is imported."""
    for package in registry.names():
        importlib.import_module(package)
    return dict(_moved.MOVED)


def engine_modules_not_named(page_text: str, common: Path) -> list[str]:
    """The modules under ``common`` (``__init__`` aside) that ``page_text`` names neither by path
    (``nn/layers.py``, ``common/nn/layers.py``) nor dotted (``common.nn.layers``)."""
    missing = []
    for path in sorted(common.rglob("*.py")):
        relative = path.relative_to(common)
        dotted = ".".join(("common", *relative.with_suffix("").parts))
        if path.name == "__init__.py":
            continue
        names = (f"`{relative.as_posix()}`", f"common/{relative.as_posix()}", f"`{dotted}`")
        if not any(name in page_text for name in names):
            missing.append(relative.as_posix())
    return missing


def test_engine_page_names_every_engine_module():
    missing = engine_modules_not_named(ENGINE_PAGE.read_text(), REPO / "common")
    assert not missing, f"docs/engine.md does not name these modules of common/ (add a line each): {missing}"


def test_the_module_check_finds_an_unnamed_module(tmp_path):
    # The rule above must be able to fail: a new module, in a subpackage, that the page does not name.
    (tmp_path / "nn").mkdir()
    for name in ("__init__.py", "config.py", "nn/__init__.py", "nn/layers.py", "nn/new_layer.py"):
        (tmp_path / name).write_text("")
    page = "| `config.py` | ... |\n| `nn/layers.py` | ... |\n"
    assert engine_modules_not_named(page, tmp_path) == ["nn/new_layer.py"]


def test_engine_page_lists_every_moved_module():
    # Each old path with its new one, on one row of the "Moved modules" table.
    rows = [line for line in ENGINE_PAGE.read_text().splitlines() if line.startswith("| `")]
    missing = [f"{old} -> {new}" for old, new in moved_modules().items()
               if not any(f"`{old}`" in row and f"`{new}`" in row for row in rows)]
    assert moved_modules(), "no moved modules found (common/_moved.py's table)"
    assert not missing, f"docs/engine.md's Moved modules table lacks: {missing}"
