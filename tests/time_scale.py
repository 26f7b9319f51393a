"""How much slower this machine runs than the one the tests' time limits were set on.

The VMs this suite runs on vary by up to 3× in speed from one hour to the next (docs/benchmarks.md,
"make test on a VM three times slower"): on a slow one, live deployments that answer in seconds
answered in minutes and waits sized for the fast kind ran out although nothing was wrong. The
controller measures the machine once, before any worker starts (an idle machine), and every limit
a test waits under is multiplied by the factor it hands the workers in the environment.
"""

from __future__ import annotations

import os
import time

ENV = "TAXIWAY_TEST_TIME_SCALE"
REFERENCE_S = 0.375  # _probe() on the fast kind of VM (a 20 M-addition loop took 1.5 s there)
CAP = 4.0  # past this a machine is too slow for the suite's 20 minutes anyway: fail rather than crawl


def _probe(n: int = 5_000_000) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(n):
        total += i
    return time.perf_counter() - start


def measure(repeats: int = 3) -> float:
    """The factor for this machine now: the fastest of a few pure-Python loops against the reference,
    never below 1 (a faster machine keeps the limits as written)."""
    return min(CAP, max(1.0, min(_probe() for _ in range(repeats)) / REFERENCE_S))


def factor() -> float:
    """The factor the controller measured (1 where none was: a module imported outside pytest)."""
    return float(os.environ.get(ENV, "1"))


def scaled(seconds: float) -> float:
    return seconds * factor()
