"""Logging, configured once per process, rank-aware.

Rank 0 logs at INFO, every other rank at WARNING and above, all to stdout
(where SLURM and horovodrun collect a rank's output).  With several ranks each
line starts with ``[rank/size]``; warnings and errors say so.  ``print`` is
left to a command's own result (a table, a JSON line, a one-line error).
"""

from __future__ import annotations

import logging
import sys

class _Formatter(logging.Formatter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            message = f"{record.levelname.lower()}: {message}"
        return self.prefix + message


def configure(rank: int, size: int, packages: tuple[str, ...], stream=None, instance: int | None = None) -> None:
    """(Re)configure the loggers of ``packages`` (the engine's ``common`` and the running application's
    package) for this process's rank.  Called by each entry point once it knows its rank.  ``instance``:
    the model this rank trains when a job trains several (``distributed.instances``); ``rank`` and ``size``
    are then the instance's, and each instance's rank 0 logs at INFO."""
    handler = logging.StreamHandler(stream or sys.stdout)
    where = f"{rank}/{size}" if size > 1 else ""
    if instance is not None:
        where = f"instance {instance}" + (f" {where}" if where else "")
    handler.setFormatter(_Formatter(f"[{where}] " if where else ""))
    for name in packages:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
        logger.propagate = False
