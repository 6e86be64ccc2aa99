"""Ctrl-C and SIGTERM while a suite command's modules load: one line and the shell's code.

``python -m <package>.<command>`` imports the engine and its application before ``common.cli.run_command`` (the
one way in, which turns SIGINT and SIGTERM into one line each) is reached; a signal in that window would print
the traceback of whichever import it landed in.  When the process runs one of this project's modules as its
command (``sys.orig_argv``: ``-m`` and a module of a package beside ``common/``), this package's import puts
handlers in place that say so in one line and end the process (nothing has been written yet); ``run_command``
puts Python's own back as it starts.  A library user (a notebook, a script importing the suite) is not touched.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import threading

PROJECT = pathlib.Path(__file__).resolve().parents[2]
_installed = False


def running_a_command() -> str | None:
    """The module this process runs as ``python -m`` when it is one of this project's (None otherwise)."""
    argv = list(getattr(sys, "orig_argv", ()))
    if "-m" not in argv or argv.index("-m") + 1 >= len(argv):
        return None
    module = argv[argv.index("-m") + 1]
    package = module.split(".")[0]
    return module if (PROJECT / package / "__init__.py").is_file() else None


def _end(signum, frame) -> None:
    said = "interrupted (Ctrl-C)" if signum == signal.SIGINT else "terminated (SIGTERM)"
    try:
        os.write(2, f"{said} while {running_a_command() or 'the command'} was starting; nothing was "
                    "written\n".encode())
    finally:
        os._exit(128 + signum)


def quiet_until_run_command() -> None:
    """The handlers of the loading window (module docstring), in the main thread of a suite command only."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread() or running_a_command() is None:
        return
    for number in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(number) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(number, _end)
    _installed = True


def loading_window_over() -> None:
    """Python's own handlers back (``run_command`` as it starts): from here the command says what it left."""
    for number, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(number) is _end:
            signal.signal(number, default)
