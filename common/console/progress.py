"""Progress of the data generators: a tqdm bar on a terminal, a few plain lines elsewhere.

tqdm redraws its bar with carriage returns; in a file (CI logs, SLURM output)
every redraw lands on one ever-growing line (60 KB for the CosmoFlow demo's
mock data).  Off a terminal this reports at each quarter instead.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    """``with Progress(total, "mock train") as bar: ... bar.update(n)``; to stderr."""

    def __init__(self, total: int, desc: str, unit: str = "it", enabled: bool = True, stream=None):
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0
        self.done = 0
        self._bar = None
        self._next_report = 0.25
        self._started = time.perf_counter()
        if self.enabled and self.stream.isatty():
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream)

    def update(self, count: int = 1) -> None:
        self.done += count
        if self._bar is not None:
            self._bar.update(count)
            return
        if not self.enabled:
            return
        if self._next_report <= 1.0 and self.done >= self._next_report * self.total:
            elapsed = time.perf_counter() - self._started
            print(f"{self.desc}: {self.done}/{self.total} {self.unit} ({elapsed:.0f} s)", file=self.stream,
                  flush=True)
            self._next_report = (int(4 * self.done / self.total) + 1) / 4

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
