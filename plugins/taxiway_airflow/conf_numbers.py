"""Numbers a trigger's ``conf`` may not hold: those msgpack cannot carry to a task. Its own module, as
the api-server's trigger guard checks them before a run exists and must stay light to import."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

INT64 = (-(2**63), 2**63 - 1)  # the integers msgpack carries to a task


def bad_numbers(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, reason) of each number under ``value`` that msgpack cannot carry: PostgreSQL's jsonb keeps any
    integer, and a whole float as one; msgpack, which sends a run's conf to each task, fails beyond 64 bits."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from bad_numbers(sub, f"{path}.{str(key)[:80]}")
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from bad_numbers(sub, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        yield path, "not a finite number"
    elif isinstance(value, int | float) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        yield path, "a number outside the signed 64-bit range (-2**63 to 2**63-1)"  # jsonb keeps 1e30 as an integer
