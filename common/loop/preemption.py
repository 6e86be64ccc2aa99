"""Stop requests by signal: SIGTERM, and SIGUSR1 (SLURM's warning before the time limit).

Standard library only, so the entry points install the handlers before they
import TensorFlow: a signal during the seconds of start-up is then a stop
request honoured at the first training step (checkpoint, exit 75, requeue),
not the default action of SIGUSR1, which ends the process and the job with it.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Installs handlers for SIGTERM and SIGUSR1 that set a flag (restored on ``close``)."""

    def __init__(self, signals=STOP_SIGNALS):
        self.requested = False
        self.signal_name = None
        self._previous = {}
        for sig in signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:   # not the main thread (e.g. under some test runners)
                pass

    def _handle(self, signum, frame):
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def close(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
