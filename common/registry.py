"""The applications this suite runs, registered once: one line each in the ``hpc_dl_suite.applications``
entry-point group of ``pyproject.toml``, naming the package's declaration::

    [project.entry-points."hpc_dl_suite.applications"]
    cosmoflow = "cosmoflow.application:APPLICATION"

The name is the package (``python -m <name>.train``, ``python -m <name>.evaluate``).  The declaration is an
:class:`~common.application.Application`, or :class:`~common.application.Tasks` where one package holds
several applications that a config key chooses between (climate_seg's ``task``).  ``make setup`` (or
``pip install -e .``) writes the group into the environment; the engine never names an application itself
(tests/test_layout.py).

Lazy: listing the names reads the installed metadata and imports nothing; a declaration imports its
``application.py`` only (no TensorFlow), so ``--help`` and the config checks answer without TensorFlow.
"""

from __future__ import annotations

import functools
import importlib.metadata
import pathlib
import tomllib

from common.application import Application, Tasks
from common.config import read_yaml
from common.errors import UserInputError

GROUP = "hpc_dl_suite.applications"
REFRESH = "make setup, or .venv/bin/pip install --no-deps -e . (writes pyproject.toml's entry points)"


@functools.cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    # Every distribution on the path, the first one found naming an application winning, not only the first of
    # each name as importlib.metadata.entry_points() keeps: a checkout on PYTHONPATH may hold a metadata folder
    # left by an older build (hpc_dl_suite.egg-info, without this group) in front of the installed one.
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for distribution in importlib.metadata.distributions():
        for entry_point in distribution.entry_points.select(group=GROUP):
            found.setdefault(entry_point.name, entry_point)
    return found or _checkout_entry_points()


def _checkout_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The group as this checkout's ``pyproject.toml`` writes it, for a checkout used without being installed
    (``PYTHONPATH=<checkout>`` beside a site's TensorFlow, an environment of Keras on JAX): the same lines."""
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        group = tomllib.loads(pyproject.read_text())["project"]["entry-points"][GROUP]
    except tomllib.TOMLDecodeError as exc:
        raise UserInputError(f"{pyproject}: not valid TOML ({exc}); the applications are registered there") from None
    except (OSError, KeyError, TypeError):
        return {}
    return {name: importlib.metadata.EntryPoint(name, value, GROUP) for name, value in group.items()}


def names() -> tuple[str, ...]:
    """The registered applications' packages, sorted; a UserInputError when the environment holds none."""
    registered = _entry_points()
    if not registered:
        raise UserInputError(f"no application is registered in this Python environment (entry-point group {GROUP} "
                             f"of pyproject.toml): {REFRESH}")
    return tuple(sorted(registered))


@functools.cache
def declaration(name: str) -> Application | Tasks:
    """The declaration registered as ``name``, imported now (its ``application.py``: no TensorFlow)."""
    if name not in names():
        raise UserInputError(f"{name}: not a registered application (registered: {', '.join(names())}; after "
                             f"adding one to pyproject.toml: {REFRESH})")
    entry_point = _entry_points()[name]
    try:
        declared = entry_point.load()
    except (ModuleNotFoundError, AttributeError) as exc:
        if not _names_nothing(entry_point, exc):
            raise   # a missing dependency inside the application: its own traceback says more
        raise UserInputError(f"application {name}: its registration {entry_point.value} names nothing that exists "
                             f"({exc}); after renaming it in pyproject.toml: {REFRESH}") from None
    if not isinstance(declared, (Application, Tasks)):
        raise TypeError(f"application {name}: {entry_point.value} is a {type(declared).__name__}, expected a "
                        "common.application.Application or Tasks")
    return declared


def _names_nothing(entry_point: importlib.metadata.EntryPoint, exc: ImportError | AttributeError) -> bool:
    """Whether ``exc`` says the registration itself is stale: its module or its attribute is not there."""
    if isinstance(exc, ModuleNotFoundError):
        return exc.name is not None and f"{entry_point.module}.".startswith(f"{exc.name}.")
    return exc.name == entry_point.attr


def applications(name: str) -> tuple[Application, ...]:
    """Every application of the package ``name`` (one, or each task's)."""
    declared = declaration(name)
    return tuple(declared.choices.values()) if isinstance(declared, Tasks) else (declared,)


def application(name: str, config_path=None) -> Application:
    """The application of the package ``name`` that the config at ``config_path`` is for: the package's only one,
    or the task its config chooses (the default task without a config)."""
    declared = declaration(name)
    if isinstance(declared, Application):
        return declared
    return declared.choose(read_yaml(config_path) if config_path is not None else {}, config_path)
