"""Progress for long scans: a bar on an interactive terminal, periodic log lines elsewhere
(the Airflow task log), so a user always sees that a big preflight is moving."""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("taxiway.progress")


class Progress:
    def __init__(self, total: int, desc: str, unit: str = "B", every_s: float = 5.0) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.done = 0
        self._lock = threading.Lock()  # updated from hashing threads
        self._started = self._last = time.monotonic()
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm  # only on a terminal: a task log never draws a bar

            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False)

    def update(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
                return
            now = time.monotonic()
            if now - self._last < self.every_s:
                return
            self._last = now
            rate = self.done / max(now - self._started, 1e-9)
            log.info("%s: %.0f%% (%d/%d %s, %.1f M%s/s)", self.desc, 100 * self.done / max(self.total, 1),
                     self.done, self.total, self.unit, rate / 1e6, self.unit)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elapsed = time.monotonic() - self._started
        log.info("%s: done, %d %s in %.2f s", self.desc, self.done, self.unit, elapsed)
