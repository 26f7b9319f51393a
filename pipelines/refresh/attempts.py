"""Refresh attempts per batch, so a batch that keeps failing is quarantined instead of failing every
refresh after it.

A batch is tried by a refresh run when the run's plan takes it; the batch stays new (unconsumed)
until a refresh that trained on it becomes champion. So every earlier run recorded for a batch
that is still new is a failed attempt: failed preflight, failed training, or a gate the version did
not pass. Kept in ``$TAXIWAY_HOME/refresh/attempts.json`` (one writer at a time under a file lock,
written atomically), keyed by batch id and manifest sha256.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipelines.refresh.landing import Batch
from pipelines.run_folder import taxiway_home
from trainer import fsio


def path() -> Path:
    return taxiway_home() / "refresh" / "attempts.json"


def _key(batch: Batch) -> str:
    return f"{batch.id} {batch.manifest_sha256}"


@contextmanager
def _locked() -> Iterator[dict[str, list[str]]]:
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(target.read_text()) if target.exists() else {}
        yield state
        fsio.write_json(target, state)


def take(batches: list[Batch], run_key: str, max_attempts: int) -> tuple[list[Batch], list[tuple[Batch, list[str]]]]:
    """Record ``run_key`` as an attempt on each batch, except batches already tried ``max_attempts``
    times by other runs: those are returned as quarantined, with the runs that tried them. A retry
    of the same run counts once."""
    kept, quarantined = [], []
    with _locked() as state:
        for batch in batches:
            runs = state.setdefault(_key(batch), [])
            earlier = [r for r in runs if r != run_key]
            if len(earlier) >= max_attempts:
                quarantined.append((batch, earlier))
                continue
            if run_key not in runs:
                runs.append(run_key)
            kept.append(batch)
    return kept, quarantined
