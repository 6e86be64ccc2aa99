"""TensorFlow's C++ start-up lines kept off the console.

TensorFlow 2.21 logs through Abseil before anything initialises Abseil's log,
so ``TF_CPP_MIN_LOG_LEVEL`` does not reach its start-up lines: every process
prints ``WARNING: All log messages before absl::InitializeLog() ...`` and
``I0000 ... port.cc] oneDNN custom operations are on ...``, twice (two copies of
the library), on every rank, and on its first int64 kernel ``E0000 ... util.cc]
oneDNN supports DT_INT64 only on platforms with AVX-512`` (also on CPUs that
have AVX-512; the op falls back to Eigen either way).  When ``tensorflow`` is
first imported, file descriptor 2 becomes a pipe read by a small filter process
that writes every line but those to the real standard error, in order, as it
arrives.  The suite's own line about the CPU and the kernel set (``common.cpu``)
says what the oneDNN lines said.

The filter is a separate process so that nothing is lost when this one dies: it
ignores the signals a job's processes get (INT, TERM, HUP, USR1, USR2), reads
until every writer has closed the pipe, and only then exits.  :func:`finish`
(called by every entry point's exit) closes this process's end and waits for it
to drain, so that a job step or a launcher that kills what is left once a rank has
exited cannot cut the last lines.

A ``TF_CPP_MIN_LOG_LEVEL`` the user set wins: then nothing is filtered (set it to
0 to see everything).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import select
import subprocess
import sys

VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
_SET_BY_SUITE = "HPC_DL_SUITE_SET_TF_CPP_MIN_LOG_LEVEL"   # set beside it, so ranks started from here filter too

# Abseil's line format, "I1203 06:21:07.123456   19447 port.cc:153] ...", at INFO (I) or WARNING (W); the
# notice Abseil prints once before its first line; and the one ERROR line that is not one (see above).
NOISE = re.compile(r"(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                   r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] "
                   r"|E\d{4} \d\d:\d\d:\d+\.\d+ +\d+ util\.cc:\d+\] oneDNN supports DT_INT64 only on platforms "
                   r"with AVX-512\.)")

# The filter process: standard input (the pipe) to standard output (the real standard error), line by line;
# a partial line is written once no more arrives for 50 ms (a prompt, a progress bar's carriage return).
# Run with -I -S: the standard library only, no site packages, started in ~20 ms.
_FILTER = r"""
import os, re, select, signal, sys
for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
noise = re.compile(sys.argv[1].encode())
os.write(int(sys.argv[2]), b"1")   # ready: the signals above are ignored
os.close(int(sys.argv[2]))
broken = False
def write(data):
    global broken
    while data and not broken:
        try:
            data = data[os.write(1, data):]
        except InterruptedError:
            continue
        except OSError:
            broken = True          # standard error gone: keep reading, so that the writers never block
pending = b""
while True:
    ready, _, _ = select.select([0], [], [], 0.05 if pending else None)
    if not ready:
        write(pending)
        pending = b""
        continue
    chunk = os.read(0, 1 << 16)
    if not chunk:
        break
    *lines, pending = re.split(rb"(?<=[\r\n])", pending + chunk)
    write(b"".join(line for line in lines if not noise.match(line)))
write(pending)
"""

_filter: subprocess.Popen | None = None


def keep(text: str) -> str:
    """``text`` without TensorFlow's start-up lines (what the filter process writes of it)."""
    return "".join(line for line in text.splitlines(keepends=True) if not NOISE.match(line))


def start_filter() -> bool:
    """File descriptor 2 through the filter process from now on; False (and nothing changed) if it cannot
    be started."""
    global _filter
    if _filter is not None:
        return True
    if not sys.executable:
        return False
    sys.stderr.flush()
    read, write = os.pipe()
    ready, told = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _FILTER, NOISE.pattern, str(told)],
                                   stdin=read, stdout=2, stderr=subprocess.DEVNULL, pass_fds=(told,))
    except OSError:
        process = None
    os.close(read)
    os.close(told)
    # Redirect only once the filter ignores the job signals: a USR1 sent to the process group while it
    # starts would otherwise end it, and with it everything written since.
    started = process is not None and bool(select.select([ready], [], [], 30.0)[0]) and os.read(ready, 1) == b"1"
    os.close(ready)
    if not started:
        if process is not None:
            process.kill()
            process.wait()
        os.close(write)
        return False
    _filter = process
    os.dup2(write, 2)
    os.close(write)
    return True


def finish(timeout: float = 5.0) -> None:
    """Before this process exits: close its end of the pipe and wait (at most ``timeout`` seconds: a child
    may still hold the pipe) until the filter has written everything."""
    if _filter is None:
        return
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        os.close(2)
        _filter.wait(timeout)
    except (OSError, subprocess.TimeoutExpired):
        pass


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Starts the filter when ``tensorflow`` is first imported (so that ``--help`` and the tools that need
    no TensorFlow start no process), then steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow":
            sys.meta_path.remove(self)
            start_filter()
        return None


def install(environ=None) -> bool:
    """Filter TensorFlow's lines in this process once it imports TensorFlow, unless the user set
    ``TF_CPP_MIN_LOG_LEVEL`` or TensorFlow is already imported; True if installed.  Also sets the variable
    to 2 (errors only) for the lines TensorFlow logs once its log honours it."""
    environ = os.environ if environ is None else environ
    user_set = VARIABLE in environ and environ.get(_SET_BY_SUITE) != "1"
    if user_set or "tensorflow" in sys.modules:
        return False
    environ[VARIABLE] = "2"
    environ[_SET_BY_SUITE] = "1"
    if not any(isinstance(finder, _QuietTensorFlow) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())
    return True
