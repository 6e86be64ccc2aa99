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

    def close(self, absorb: bool = False):
        """Put back the handlers there were; with ``absorb`` (the process is ending on a stop request, exit 75) a
        late stop signal is ignored instead: a rank that stopped on another rank's signal may get its own after
        this, and SIGUSR1's default action would end it with 138, which a launcher that requeues on 75 does not
        requeue."""
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if absorb else handler)
        self._previous = {}
