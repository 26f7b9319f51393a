"""A task's end, noticed when it happens: a workaround for a wake-up race in the task supervisor of
Airflow 3.3 (``airflow.sdk.execution_time.supervisor``).

The supervisor waits in ``select()`` on its task process's sockets and, after each wake-up, polls
the process once (``waitpid`` without waiting). The kernel closes a dying process's files a moment
before the process can be reaped, so the last end-of-file often comes first: the poll finds the
process still there, no socket is left to wake ``select()``, and the supervisor sleeps out
``[workers] min_heartbeat_interval`` (5 s by default) while its worker slot stays taken. Seen on
about half of the data stages' one- and two-second tasks when two Celery workers share two cores
(bench/scaleout_bench.py): a second of every three lost.

Once every socket is at end-of-file the process is exiting, so the patched check waits for it in
short polls, for at most ``EXIT_WAIT_S``, before the loop goes back to ``select()``. Each Celery
worker installs it at start-up (``celery_config.preload``); a supervisor without the method it
wraps is left alone, with a warning.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from airflow.sdk.execution_time.supervisor import WatchedSubprocess

log = logging.getLogger("taxiway")

EXIT_WAIT_S = 1.0  # a process with every socket closed is inside exit(); this bounds a surprise
POLL_S = 0.002


def install() -> bool:
    """Patch ``WatchedSubprocess._check_subprocess_exit`` (once); False when it is not there."""
    original = WatchedSubprocess.__dict__.get("_check_subprocess_exit")
    if original is None:
        log.warning("airflow's task supervisor has no _check_subprocess_exit: exit wait not installed")
        return False
    if getattr(original, "taxiway_exit_wait", False):
        return True

    @functools.wraps(original)
    def check_exit(self: Any, raise_on_timeout: bool = False, expect_signal: int | None = None) -> int | None:
        code = original(self, raise_on_timeout=raise_on_timeout, expect_signal=expect_signal)
        deadline = time.monotonic() + EXIT_WAIT_S
        while code is None and not self._open_sockets and time.monotonic() < deadline:
            time.sleep(POLL_S)
            code = original(self, raise_on_timeout=raise_on_timeout, expect_signal=expect_signal)
        return code

    check_exit.taxiway_exit_wait = True  # type: ignore[attr-defined]
    WatchedSubprocess._check_subprocess_exit = check_exit
    return True
