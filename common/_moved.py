"""Old module paths kept for one release after a module moved (the table in docs/engine.md, "Moved modules").

Each old path is a module of one call, ``moved_to("the.new.path", __name__, __spec__)``.  Imported (``from
common import optimizers``), it warns once (a module runs once per process) and puts the new module in its own
place, so the old name gives the very module the new one does, its classes the same objects.  Run as ``python
-m the.old.path ...``, it warns and runs the new module as ``__main__`` with the same arguments: the exit code
is the new command's.  Nothing here imports TensorFlow, so ``--help`` stays as fast as the new command's.
"""

from __future__ import annotations

import importlib
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


def moved_to(new: str, name: str, spec) -> None:
    """Stand the calling shim module (``name``: its ``__name__``, ``spec``: its ``__spec__``) in for ``new``."""
    old = spec.name
    if name == "__main__":
        # stacklevel 2: the shim's own line (above it is only runpy).
        warnings.warn(f"`python -m {old}` is now `python -m {new}`; the old name is removed in {REMOVED_IN}",
                      CATEGORY, stacklevel=2)
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return
    # stacklevel 3: past this function and the shim, the import machinery's frames are skipped by `warnings`,
    # so the warning names the user's line that imported the old path.
    warnings.warn(f"{old} moved to {new}; import it from there (the old path is removed in {REMOVED_IN})",
                  CATEGORY, stacklevel=3)
    # The import system reads sys.modules[old] back after running the shim: the new module is what it binds.
    sys.modules[old] = importlib.import_module(new)
