"""TensorFlow's C++ start-up lines kept off the console.

TensorFlow 2.21 logs through Abseil before anything initialises Abseil's log,
so ``TF_CPP_MIN_LOG_LEVEL`` does not reach its start-up lines: every process
prints ``WARNING: All log messages before absl::InitializeLog() ...`` and
``I0000 ... port.cc] oneDNN custom operations are on ...``, twice (two copies of
the library), on every rank.  While ``tensorflow`` is first imported, its
standard error goes to a temporary file; afterwards every line but those INFO
and WARNING start-up lines is written to the real standard error, in order.
The suite's own line about the CPU and the kernel set (``common.console.cpu``) says
what the oneDNN line said.

A ``TF_CPP_MIN_LOG_LEVEL`` the user set that asks for more than the suite's
level (0: everything, 1: warnings too) turns the filter off: set it to 0 to see
everything, for example when TensorFlow itself fails to load (a process that
TensorFlow aborts during the import loses what it wrote there).  One that asks
for as little or less (2, 3) is kept as it is, and filtered as well: the
start-up lines ignore the variable, and the user asked for quiet.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
SUITE_LEVEL = 2   # TensorFlow's errors only
_SET_BY_SUITE = "HPC_DL_SUITE_SET_TF_CPP_MIN_LOG_LEVEL"   # the value the suite set: children filter too, unless changed

# Abseil's line format, "I1203 06:21:07.123456   19447 port.cc:153] ...", at INFO (I) or WARNING (W);
# and the notice Abseil prints once before its first line.
NOISE = re.compile(r"(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                   r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] )")


def keep(text: str) -> str:
    """``text`` without TensorFlow's INFO/WARNING start-up lines."""
    return "".join(line for line in text.splitlines(keepends=True) if not NOISE.match(line))


@contextlib.contextmanager
def filtered_stderr():
    """File descriptor 2 captured for the block, then written out through :func:`keep`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = keep(capture.read().decode("utf-8", errors="replace"))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` once, with its loader's ``exec_module`` run under :func:`filtered_stderr`."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def quiet_exec_module(module):
            with filtered_stderr():
                exec_module(module)

        spec.loader.exec_module = quiet_exec_module
        return spec


def user_level(environ) -> int | None:
    """The ``TF_CPP_MIN_LOG_LEVEL`` the user set, as TensorFlow reads it (anything but a whole number: 0,
    everything); None when the user set none (or the suite set it, in a process that started this one)."""
    if VARIABLE not in environ or environ.get(_SET_BY_SUITE) == environ[VARIABLE]:
        return None
    value = environ[VARIABLE].strip()
    return int(value) if re.fullmatch(r"[0-9]+", value) else 0


def install(environ=None) -> bool:
    """Filter TensorFlow's first import in this process, unless the user's ``TF_CPP_MIN_LOG_LEVEL`` asks for
    more than the suite's level or TensorFlow is already imported; True if installed.  Without a user's
    value, also sets the variable to :data:`SUITE_LEVEL` for the lines TensorFlow logs once its log honours it."""
    environ = os.environ if environ is None else environ
    level = user_level(environ)
    if (level is not None and level < SUITE_LEVEL) or "tensorflow" in sys.modules:
        return False
    if level is None:
        environ[VARIABLE] = environ[_SET_BY_SUITE] = str(SUITE_LEVEL)
    if not any(isinstance(finder, _QuietTensorFlow) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())
    return True
