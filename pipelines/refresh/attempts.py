"""Refresh attempts per batch, so a batch that keeps failing is quarantined instead of failing every
refresh after it, and does not take healthy batches down with it.

A batch is tried by a refresh run when the run's plan takes it; the batch stays new (unconsumed)
until a refresh that trained on it becomes champion. So every earlier run recorded for a batch
that is still new against the same champion is a failed attempt: failed preflight, refused data, or
a gate the version did not pass. A failure that is not the batch's (a service, the machine, a limit,
a cancel) is excused (``excuse``), and a run a trigger shaped (its conf overrides a setting) records no
attempt at all: only the batch's own data counts toward its quarantine. Batches that never failed go first, together; a
batch that failed before is then tried alone, so only the batch that fails by itself reaches
``refresh.max_attempts`` and is quarantined. Kept in ``$TAXIWAY_HOME/refresh/attempts.json`` (one
writer at a time under a file lock, written atomically), keyed by batch id, manifest sha256 and
the champion it was tried against (a new champion starts every count afresh). Batches found to hold
nothing new for a champion (every document repeats trained data) are kept beside it, in
``repeats.json``, so later plans drop them like re-sends. A person may release a quarantined batch
(``release``): its count against the champion is cleared, so the next refresh tries it again, and
who released it, when and the attempts cleared are kept in the same file under ``RELEASED``.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.errors import BadInput, CheckFailed
from pipelines.refresh.landing import Batch
from pipelines.run_folder import taxiway_home
from trainer import fsio

RELEASED = "released"  # attempts.json's key of the release records (a batch's key holds two spaces)
EXCUSED = "excused"    # its key of the runs whose failure was not their batches' (``excuse``)
MAX_WHO = 200  # characters of a releaser's name kept
DATA_STAGES = ("assemble", "preflight", "tokenize")  # where a refresh reads its batches' data


class NotQuarantined(BadInput):
    """A release asked for a batch that is not quarantined; the message says what it is."""


def path() -> Path:
    return taxiway_home() / "refresh" / "attempts.json"


def _key(batch: Batch, champion: str) -> str:
    return f"{batch.id} {batch.manifest_sha256} {champion}"


@dataclass(frozen=True)
class Taken:
    """What a refresh trains on (``kept``), what waits for a later run (``held``: failed before and
    tried alone later), and what is quarantined (with the runs that failed it)."""

    kept: list[Batch] = field(default_factory=list)
    held: list[Batch] = field(default_factory=list)
    quarantined: list[tuple[Batch, list[str]]] = field(default_factory=list)


@contextmanager
def _locked(target: Path) -> Iterator[dict]:
    """The JSON state in ``target``, read and written back (atomically) under its file lock."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(target.read_text()) if target.exists() else {}
        yield state
        fsio.write_json(target, state)


def take(batches: list[Batch], run_key: str, champion: str, max_attempts: int, record: bool = True) -> Taken:
    """Decide which of the new ``batches`` this run (``run_key``) tries, and record the attempt (not with
    ``record=False``: a run a trigger shaped, whose failure says nothing of the batch)."""
    with _locked(path()) as state:
        excused = state.get(EXCUSED, {})
        failed = {b.id: [r for r in state.get(_key(b, champion), []) if r != run_key and r not in excused]
                  for b in batches}
        quarantined = [(b, failed[b.id]) for b in batches if len(failed[b.id]) >= max_attempts]
        left = [b for b in batches if len(failed[b.id]) < max_attempts]
        never = [b for b in left if not failed[b.id]]
        kept = never or left[:1]
        for batch in kept if record else []:
            runs = state.setdefault(_key(batch, champion), [])
            if run_key not in runs:
                runs.append(run_key)
    return Taken(kept, [b for b in left if b not in kept], quarantined)


def caused_by_data(stage: str, kind: str) -> bool:
    """Whether a refresh that failed at ``stage`` with a failure of ``kind`` (``pipelines.errors``' label)
    failed on its batches' data: refused or failed checks where the data is read. Anything else (a
    service, the machine, a limit, a cancel, the trainer) is ``excuse``d."""
    return stage in DATA_STAGES and kind in (BadInput.label, CheckFailed.label)


def excuse(run_key: str, why: str) -> None:
    """The refresh run ``run_key`` failed for a cause not in its batches' data (a service, the machine, a
    limit): its attempt no longer counts toward any batch's quarantine."""
    with _locked(path()) as state:
        state.setdefault(EXCUSED, {})[run_key] = why[:MAX_WHO]


def _repeats_path() -> Path:
    return taxiway_home() / "refresh" / "repeats.json"


def record_repeat(batch: Batch, champion: str, reason: str) -> None:
    """A batch whose every train document repeats data ``champion`` was trained on: nothing to train,
    so later plans against the same champion drop it like a whole re-send."""
    with _locked(_repeats_path()) as state:
        state[_key(batch, champion)] = reason


def repeats(batches: list[Batch], champion: str) -> dict[str, str]:
    """Batch id → why, for the ``batches`` already found to hold nothing new for ``champion``."""
    state = _read(_repeats_path())
    return {b.id: state[k] for b in batches if (k := _key(b, champion)) in state}


def _read(target: Path) -> dict[str, Any]:
    return json.loads(target.read_text()) if target.exists() else {}


def tried(batches: list[Batch], champion: str) -> dict[str, list[str]]:
    """Batch id → the refresh runs recorded as having tried it against ``champion`` (oldest first)."""
    state = _read(path())
    excused = state.get(EXCUSED, {})
    return {b.id: [r for r in state.get(_key(b, champion), []) if r not in excused] for b in batches}


def released(batches: list[Batch]) -> dict[str, list[dict[str, Any]]]:
    """Batch id → its release records (``by``, ``at``, ``champion``, ``attempts`` cleared), oldest first."""
    records = _read(path()).get(RELEASED, {})
    return {b.id: found for b in batches if (found := records.get(f"{b.id} {b.manifest_sha256}"))}


def release(batch: Batch, champion: str, who: str, max_attempts: int) -> dict[str, Any]:
    """Clear ``batch``'s failed attempts against ``champion`` so the next refresh tries it again, and
    record who did it and when; ``NotQuarantined`` when it has fewer than ``max_attempts`` (checked
    under the lock, so two releases of one batch record one)."""
    with _locked(path()) as state:
        runs = state.get(_key(batch, champion), [])
        if len(runs) < max_attempts:
            raise NotQuarantined(f"batch {batch.id} is not quarantined: it took part in {len(runs)} failed "
                                 f"refresh(es) of {champion}, refresh.max_attempts is {max_attempts}")
        record = {"by": who[:MAX_WHO], "at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
                  "champion": champion, "attempts": runs}
        del state[_key(batch, champion)]
        state.setdefault(RELEASED, {}).setdefault(f"{batch.id} {batch.manifest_sha256}", []).append(record)
    return record
