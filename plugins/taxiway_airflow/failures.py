"""The one place Airflow learns what kind of failure a stage raised (``pipelines/errors.py``).

Bad input and failed checks become ``AirflowFailException``: the task fails at once whatever its
``retries`` (retrying cannot fix a config or a gate). Transient failures, and unexpected ones,
propagate as they are, so Airflow retries them with the back-off of ``RETRY``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from pipelines.errors import kind_of
from pipelines.heap import set_policy

F = TypeVar("F", bound=Callable[..., Any])

# what every retrying task uses: a transient failure is tried again after 10 s, 20 s, 40 s, …
RETRY: dict[str, Any] = {"retry_delay": timedelta(seconds=10), "retry_exponential_backoff": 2.0,
                         "max_retry_delay": timedelta(minutes=10)}


@contextmanager
def failure_kinds() -> Iterator[None]:
    try:
        yield
    except AirflowException:
        raise
    except Exception as exc:
        kind = kind_of(exc)
        if kind is not None and not kind.retry:
            raise AirflowFailException(f"{kind.label}: {exc}") from exc
        raise


def translated(fn: F) -> F:
    """``fn`` with ``failure_kinds`` around it (for task callables and operator methods), in a process
    whose allocator policy is set (``pipelines/heap.py``: once, as the task process's first Taxiway code)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        set_policy()
        with failure_kinds():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
