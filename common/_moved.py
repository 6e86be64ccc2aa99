"""Old module paths kept for one release after a module moved (docs/engine.md, "Moved modules").

One table, old path -> new path, served by one import finder on ``sys.meta_path`` (installed by
``common/__init__.py``) instead of a file at each old path: the package's folders show only the modules that are
there.  An application's own moved modules are lines of the same table, added by its package's ``__init__``
(:func:`register`), since the engine names no application.  The finder answers only for a name no file
answers for (it comes after Python's own finders), so a module written at an old path wins over the table.

Imported (``from common import optimizers``), an old path warns once (a module is imported once per process)
and gives the new module itself, its classes the same objects.  Run as ``python -m the.old.path ...`` (runpy
finds the old path through this finder and runs the code it gives), it warns and runs the new module as
``__main__`` with the same arguments: the exit code is the new command's.  Nothing here imports TensorFlow, so
``--help`` stays as fast as the new command's.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import runpy
import sys
import warnings

# The old paths go in the release after the version in pyproject.toml (0.1.x); tests/test_moved.py checks the two agree.
REMOVED_IN = "0.2.0"

# FutureWarning, not DeprecationWarning: Python shows a DeprecationWarning by default only when the code it is
# attributed to runs in __main__, so an old import in a module a user's script imports, in a notebook's helper
# module or under pytest would say nothing and then break at 0.2.0.  FutureWarning is the category Python
# shows by default everywhere, meant for the users of a program rather than its developers.
CATEGORY = FutureWarning

# The engine's moved modules; an application's come from its package (register).
MOVED = {
    "common.batch_norm": "common.nn.batch_norm",
    "common.flops": "common.nn.flops",
    "common.layers": "common.nn.layers",
    "common.metrics": "common.nn.metrics",
    "common.optimizers": "common.nn.optimizers",
    "common.precision": "common.nn.precision",
    "common.schedules": "common.nn.schedules",
    "common.callbacks": "common.loop.callbacks",
    "common.mlperf": "common.loop.mlperf",
    "common.preemption": "common.loop.preemption",
    "common.reliability": "common.loop.reliability",
    "common.checkpoint": "common.storage.checkpoint",
    "common.data": "common.storage.data",
    "common.outputs": "common.storage.outputs",
    "common.plots": "common.storage.plots",
    "common.tfrecord": "common.storage.tfrecord",
    "common.cpu": "common.console.cpu",
    "common.logs": "common.console.logs",
    "common.progress": "common.console.progress",
    "common.quiet": "common.console.quiet",
    "common.bench": "common.tools.bench",
    "common.check_data": "common.tools.check_data",
    "common.scaling": "common.tools.scaling",
    "common.slurm": "common.tools.slurm",
}


def register(moved: dict[str, str]) -> None:
    """Add a package's moved modules (old path -> new path) to the table the finder serves."""
    MOVED.update(moved)


# Names that left a module that stays, when the engine's storage hubs were split along their concepts (0.1.x):
# module -> {name: its new home, or (home, its new name)}.  Served by the module's ``__getattr__``
# (:func:`forward_names`), with the same warning, until REMOVED_IN.  Not here: ``shuffled_shards`` and
# ``shards_files`` (the rank share is ``common.loop.epochs.rank_share``, a call of another shape).
_STAGING = ("COPY_CHUNK_BYTES", "RANK_FOLDER", "STAGE_LOCK", "STAGE_MANIFEST", "StagedFormat", "check_stage_dir",
            "copy_identity", "copy_with_crc32c", "crc32c_of", "gunzip_with_crc32c", "hold_stage_lock",
            "remove_killed_copies", "source_identity", "stage_files", "staged_entries", "staged_name")
_RUN_DIRS = ("RUN_KINDS", "RunDirLock", "check_run_dir", "check_run_files", "check_run_kind", "in_use", "launch_log",
             "mark_run_dir", "record_external", "recorded_instances", "refuse_if_locked", "run_kind")
MOVED_NAMES = {
    "common.storage.data": {**dict.fromkeys(_STAGING, "common.storage.staging"),
                            "expand_environment": ("common.storage.staging", "expand_stage_dir"),
                            "epoch_seed": "common.loop.epochs", "steps_for": "common.loop.epochs",
                            "data_error_from_pipeline": "common.errors",
                            "atomic_path": "common.storage.outputs", "write_json": "common.storage.outputs"},
    "common.storage.outputs": {**dict.fromkeys(_RUN_DIRS, "common.storage.run_dirs"),
                               "is_empty_folder": "common.storage.generated",
                               "require_fillable": "common.storage.generated"},
    "common.storage.transaction": dict.fromkeys(("generated_folder", "sweep_work_folders", "WORK_LOCK"),
                                                "common.storage.generated"),
}


def forward_names(module: str):
    """The ``__getattr__`` of ``module`` (PEP 562): a name of :data:`MOVED_NAMES` that left it, taken from its new
    home with a warning naming both; anything else the AttributeError Python gives."""
    moved = MOVED_NAMES[module]

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, new_name = moved[name] if isinstance(moved[name], tuple) else (moved[name], name)
        warnings.warn(f"{module}.{name} moved to {home}.{new_name}; import it from there (the old name is removed "
                      f"in {REMOVED_IN})", CATEGORY, stacklevel=2)
        return getattr(importlib.import_module(home), new_name)

    return __getattr__


def run_as_main(old: str) -> None:
    """``python -m old``: the warning, then the new module run as ``__main__`` with this process's arguments."""
    new = MOVED[old]
    # stacklevel 2: the line of the code the finder gave runpy, named after the command the user typed.
    warnings.warn(f"`python -m {old}` is now `python -m {new}`; the old name is removed in {REMOVED_IN}",
                  CATEGORY, stacklevel=2)
    runpy.run_module(new, run_name="__main__", alter_sys=True)


class MovedModuleFinder:
    """The finder and loader of every old path in :data:`MOVED` (module docstring)."""

    @classmethod
    def find_spec(cls, fullname: str, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, cls(), origin=f"moved to {MOVED[fullname]}")

    def create_module(self, spec):
        return None   # the import system's plain module: exec_module puts the new one in its place

    def exec_module(self, module) -> None:
        old = module.__spec__.name
        new = MOVED[old]
        # stacklevel 2: `warnings` passes over the import system's own frames, so the warning names the user's
        # line that imported the old path.
        warnings.warn(f"{old} moved to {new}; import it from there (the old path is removed in {REMOVED_IN})",
                      CATEGORY, stacklevel=2)
        # The import system reads sys.modules[old] back after exec_module: the new module is what it binds.
        sys.modules[old] = importlib.import_module(new)

    def get_code(self, fullname: str):
        """What ``python -m fullname`` runs (runpy asks the loader for code, there being no file to read)."""
        return compile(f"import common._moved; common._moved.run_as_main({fullname!r})\n",
                       f"<python -m {fullname}>", "exec")


def install() -> None:
    """Put the finder on ``sys.meta_path``, after Python's own finders, once per process."""
    if MovedModuleFinder not in sys.meta_path:
        sys.meta_path.append(MovedModuleFinder)
