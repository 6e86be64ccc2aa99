"""The code's shape, read from its source: the rules of the developers' guide that a review would otherwise
have to catch (only common/distributed.py imports Horovod, an app never imports another app, an import inside
a function says why it is there)."""

from __future__ import annotations

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
APPS = ("cosmoflow", "climate_seg", "hep_cnn")
PACKAGES = APPS + ("common", "scripts")


def _sources():
    for package in PACKAGES:
        yield from sorted((REPO / package).rglob("*.py"))


def _imported_modules(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, node.module


def _function_local_imports(tree: ast.AST):
    """(function, import statement) for every import inside a function body (nested functions once)."""
    seen = set()
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                seen.add(id(node))
                yield function, node


def _top_package(node) -> str:
    if isinstance(node, ast.Import):
        return node.names[0].name.split(".")[0]
    return (node.module or "").split(".")[0]


def unexplained_local_imports(path: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
    """Imports inside functions that give no reason. An import is explained by a ``# deferred: why`` comment on
    its line or on the line above it, by an explained import of the same top-level package earlier in the same
    function (``import matplotlib`` ... ``import matplotlib.pyplot``), or by directly following an explained
    import (a block of imports shares its comment)."""
    lines = path.read_text().splitlines()
    explained_packages: dict[int, set] = {}
    explained_lines: set[int] = set()
    missing = []
    for function, node in sorted(_function_local_imports(ast.parse(path.read_text())), key=lambda x: x[1].lineno):
        own = lines[node.lineno - 1]
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        package = _top_package(node)
        ok = ("# deferred:" in own or above.startswith("# deferred:")
              or package in explained_packages.get(id(function), set())
              or (node.lineno - 1) in explained_lines)
        if ok:
            explained_packages.setdefault(id(function), set()).add(package)
            explained_lines.add(node.end_lineno)
        else:
            missing.append(f"{path.relative_to(root)}:{node.lineno}: {own.strip()}")
    return missing


def test_every_function_local_import_says_why():
    missing = [line for path in _sources() for line in unexplained_local_imports(path)]
    assert not missing, ("imports inside functions without a '# deferred: <reason>' comment (move them to the top "
                         "unless they defer TensorFlow or a heavy optional dependency):\n" + "\n".join(missing))


def test_the_checker_finds_an_unexplained_import(tmp_path):
    # The rule above must be able to fail: a file with one explained and one bare import.
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import json   # deferred: a reason\n    import json.decoder\n\n"
                      "def g():\n    import os\n")
    assert unexplained_local_imports(sample, tmp_path) == ["sample.py:6: import os"]


def test_only_common_distributed_imports_horovod():
    offenders = [f"{path.relative_to(REPO)}:{node.lineno}" for path in _sources()
                 for node, module in _imported_modules(ast.parse(path.read_text()))
                 if module.split(".")[0] == "horovod" and path != REPO / "common" / "distributed.py"]
    assert not offenders, offenders


@pytest.mark.parametrize("app", APPS)
def test_an_app_never_imports_another_app(app):
    others = set(APPS) - {app}
    offenders = [f"{path.relative_to(REPO)}:{node.lineno} imports {module}"
                 for path in sorted((REPO / app).rglob("*.py"))
                 for node, module in _imported_modules(ast.parse(path.read_text()))
                 if module.split(".")[0] in others]
    assert not offenders, offenders


def test_the_engine_imports_no_app():
    offenders = [f"{path.relative_to(REPO)}:{node.lineno} imports {module}"
                 for path in sorted((REPO / "common").rglob("*.py"))
                 for node, module in _imported_modules(ast.parse(path.read_text()))
                 if module.split(".")[0] in APPS]
    assert not offenders, offenders
