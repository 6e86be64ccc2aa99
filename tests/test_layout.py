"""The code's shape, read from its source: the rules of the developers' guide that a review would otherwise
have to catch (only common/distributed.py imports Horovod, an app never imports another app, an import inside
a function says why it is there, no two modules import each other)."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

from common import registry

REPO = pathlib.Path(__file__).resolve().parents[1]
APPS = registry.names()   # the applications, as pyproject.toml registers them (no list of them here)
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


def _function_local_imports(tree: ast.AST, function: ast.AST | None = None):
    """(function, import statement) for every import inside a function body, the function being the outermost
    one around it (nested functions once).  One walk of the tree: walking each function's body again took
    seconds over the project."""
    for node in ast.iter_child_nodes(tree):
        if function is None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _function_local_imports(node, node)
            continue
        if function is not None and isinstance(node, (ast.Import, ast.ImportFrom)):
            yield function, node
        yield from _function_local_imports(node, function)


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
                         "unless they defer TensorFlow or a heavy optional dependency; common/deferred.py names "
                         "TensorFlow, matplotlib and h5py at a module's top):\n" + "\n".join(missing))


# Lines of imports inside functions over the project's modules (tests aside), as
# `grep -cE '^\s+(import |from \S+ import )'` counts them: each defers TensorFlow, Horovod or plotting, and the
# common ones go through common/deferred.py instead.  At 57 when the rule came (#47; 100 before it).
LOCAL_IMPORT_LINES_AT_MOST = 60
LOCAL_IMPORT = re.compile(r"^\s+(import |from \S+ import )")


def test_function_local_imports_stay_few():
    lines = [f"{path.relative_to(REPO)}:{n}" for path in _sources()
             for n, line in enumerate(path.read_text().splitlines(), 1) if LOCAL_IMPORT.match(line)]
    assert len(lines) <= LOCAL_IMPORT_LINES_AT_MOST, (
        f"{len(lines)} import lines inside functions (at most {LOCAL_IMPORT_LINES_AT_MOST}): defer TensorFlow, "
        "matplotlib or h5py with common/deferred.py at the module's top instead\n" + "\n".join(lines))


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


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _deferred_module_name(node: ast.AST) -> str | None:
    """The module a ``DeferredModule("a.module")`` call names (``deferred.DeferredModule(...)`` too), else None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
    return node.args[0].value if called == "DeferredModule" and isinstance(node.args[0].value, str) else None


def _imports_of_the_suite(path: pathlib.Path, root: pathlib.Path, modules: set[str]) -> set[str]:
    """The suite's modules that ``path`` imports, at the top, inside a function or through
    ``DeferredModule("a.module")`` (common/deferred.py): a deferred import delays a dependency, it does not reverse
    it.  ``from package import module`` names the module, not the package."""
    here = _module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif deferred := _deferred_module_name(node):
            found.add(deferred)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return (found & modules) - {".".join(here)}


def import_cycles(root: pathlib.Path, packages) -> list[str]:
    """Each group of modules that import each other, directly or around a longer loop, with the imports that
    close it: ``a imports b, b imports a``."""
    paths = {_module_name(path, root): path for package in packages for path in sorted((root / package).rglob("*.py"))}
    imports = {name: _imports_of_the_suite(path, root, set(paths)) for name, path in paths.items()}
    reachable = {}
    for start in imports:
        seen, frontier = set(), [start]
        while frontier:
            for name in imports[frontier.pop()] - seen:
                seen.add(name)
                frontier.append(name)
        reachable[start] = seen
    cycles = []
    for name in sorted(imports):
        group = sorted(other for other in reachable[name] if name in reachable[other])
        if group and group[0] == name:
            cycles.append(", ".join(f"{a} imports {b}" for a in group for b in sorted(imports[a]) if b in group))
    return cycles


def test_no_two_modules_import_each_other():
    cycles = import_cycles(REPO, APPS + ("common",))
    assert not cycles, ("modules that import each other (move what both need into the one that the other "
                        "imports, or a third module):\n" + "\n".join(cycles))


def test_the_checker_finds_an_import_cycle(tmp_path):
    # The rule above must be able to fail: a loop of three, one side deferred into a function (and relative),
    # beside a module that only imports; and a loop closed only by DeferredModule names (common/deferred.py),
    # called by its own name and through its module.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("import pkg.b\n")
    (tmp_path / "pkg" / "b.py").write_text("from pkg.c import thing\n")
    (tmp_path / "pkg" / "c.py").write_text("def thing():\n    from . import a\n")
    (tmp_path / "pkg" / "d.py").write_text("from pkg import a, b\n")
    (tmp_path / "pkg" / "e.py").write_text('from common.deferred import DeferredModule\nf = DeferredModule("pkg.f")\n')
    (tmp_path / "pkg" / "f.py").write_text('from common import deferred\ne = deferred.DeferredModule("pkg.e")\n')
    assert import_cycles(tmp_path, ("pkg",)) == ["pkg.a imports pkg.b, pkg.b imports pkg.c, pkg.c imports pkg.a",
                                                 "pkg.e imports pkg.f, pkg.f imports pkg.e"]


def _documentation(tree: ast.AST) -> set[int]:
    """The string constants that are documentation: docstrings, and any string standing alone as a statement."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _names_in_code(tree: ast.AST):
    """(line, text) of every identifier, imported module and string literal (an f-string's text included) that is
    not documentation."""
    documentation = _documentation(tree)
    for node in ast.walk(tree):
        texts = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documentation:
            texts.append(node.value)
        elif isinstance(node, ast.Name):
            texts.append(node.id)
        elif isinstance(node, ast.Attribute):
            texts.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts.append(node.name)
        elif isinstance(node, ast.arg):
            texts.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            texts.append(node.arg)
        elif isinstance(node, ast.alias):
            texts.extend(name for name in (node.name, node.asname) if name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            texts.append(node.module)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            texts.extend(node.names)
        for text in texts:
            yield getattr(node, "lineno", 0), text


def applications_named_in_code(path: pathlib.Path, applications, root: pathlib.Path = REPO) -> list[str]:
    """Where the code of ``path`` names one of ``applications``: an import of its package, an identifier or a
    string literal holding a package's name as a whole word, case-blind (``COSMOFLOW_RATES``,
    ``"configs/cosmoflow/demo.yaml"`` and ``f"{x}.hep_cnn"`` do; ``cosmoflowx`` does not).  Docstrings and
    comments may name them: they show the reader an example command (``python -m cosmoflow.train``) and change
    nothing the engine does; what the engine does with an application comes from the registry."""
    word = re.compile(r"(?<![a-z0-9])(" + "|".join(map(re.escape, applications)) + r")(?![a-z0-9])", re.IGNORECASE)
    tree = ast.parse(path.read_text())
    # an ast.alias has a line of its own only from Python 3.10; sort by it, then text, for a stable message
    return [f"{path.relative_to(root)}:{line}: {text!r}" for line, text in sorted(set(_names_in_code(tree)))
            if word.search(text)]


def test_the_engine_names_no_application():
    # The engine learns the applications from the registry (common/registry.py, pyproject.toml's entry points):
    # a name typed into common/ would be a second list of them, or the engine knowing one application's science.
    offenders = [line for path in sorted((REPO / "common").rglob("*.py"))
                 for line in applications_named_in_code(path, APPS)]
    assert not offenders, ("common/ names an application in its code (take it from the application's declaration "
                           "or the registry; docstrings and comments may name one):\n" + "\n".join(offenders))


def test_the_checker_finds_an_application_named_in_code(tmp_path):
    # The rule above must be able to fail: each way of naming one, beside the documentation that may.
    sample = tmp_path / "engine.py"
    sample.write_text('''"""Run python -m cosmoflow.train (a docstring may say so)."""
import cosmoflow.model
from hep_cnn import data


def rate(name):
    """Of cosmoflow, say."""
    # a comment on cosmoflow
    COSMOFLOW_RATES = {"cosmoflow": 200.0}
    return COSMOFLOW_RATES.get(name), f"configs/{name}/../climate_seg/x.yaml", "cosmoflowx", climate_seg_task
''')
    assert applications_named_in_code(sample, ("cosmoflow", "hep_cnn", "climate_seg"), tmp_path) == [
        "engine.py:2: 'cosmoflow.model'", "engine.py:3: 'hep_cnn'",
        "engine.py:9: 'COSMOFLOW_RATES'", "engine.py:9: 'cosmoflow'",
        "engine.py:10: '/../climate_seg/x.yaml'", "engine.py:10: 'COSMOFLOW_RATES'", "engine.py:10: 'climate_seg_task'"]


def test_every_application_is_registered_once_and_the_environment_has_the_registrations():
    # A package beside common/ is an application, registered under its own name by pyproject.toml; the environment
    # the suite runs in holds exactly those registrations (refreshed by make setup after pyproject.toml changes).
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][registry.GROUP]
    packages = sorted(path.parent.name for path in REPO.glob("*/__init__.py") if path.parent.name != "common")
    assert sorted(declared) == packages, f"pyproject.toml registers {sorted(declared)}; the packages are {packages}"
    assert all(target.split(".")[0] == name for name, target in declared.items()), declared
    installed = {name: entry_point.value for name, entry_point in registry._entry_points().items()}
    assert installed == declared, f"the environment's registrations are stale: {registry.REFRESH}"
    for name in APPS:
        for application in registry.applications(name):
            assert application.package == name and application.evaluation is not None, application.name


def test_the_registry_reads_past_an_older_build_metadata_folder(tmp_path):
    # A checkout on PYTHONPATH may hold hpc_dl_suite.egg-info from an older build, without the entry points, in
    # front of the installed metadata: the applications are still found (a real process, a real metadata folder).
    stale = tmp_path / "hpc_dl_suite.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: hpc-dl-suite\nVersion: 0.0.1\n")
    code = "from common import registry; print(','.join(registry.names()))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ",".join(APPS)


def test_a_checkout_that_is_not_installed_finds_its_applications_in_its_pyproject():
    # .venv-jax (Keras on JAX, made by `make setup-jax`) has the checkout on PYTHONPATH and no installed metadata of
    # the suite: the registry reads the same lines from the checkout's pyproject.toml, importing no TensorFlow.
    jax_python = REPO / ".venv-jax" / "bin" / "python"
    if not jax_python.is_file():
        pytest.skip(f"{jax_python} missing: make setup-jax (make test does it)")
    code = ("import sys; from common import registry; print(','.join(registry.names())); "
            "print(registry.declaration('cosmoflow').name, 'tensorflow' in sys.modules)")
    result = subprocess.run([str(jax_python), "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO), "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [",".join(APPS), "cosmoflow", "False"], result.stdout
