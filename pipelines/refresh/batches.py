"""Every batch in the landing zone and what became of it, as the batches page shows it: the facts a
refresh's plan decides on (the champion's ledger, the door's check, attempts and re-sends), gathered
in one place instead of logs, ``attempts.json``, ``repeats.json`` and MLflow tags.

A batch is, against the champion now:

- ``trained``: the champion's ledger holds it (``trained_by``: the version that first trained it);
- ``re-sent``: its manifest is a trained batch's under another id, or every document repeats trained data;
- ``changed``: its manifest changed after landing, a trained id came back with another manifest, or a
  file's size is no longer the manifest's (a same-size change is found by the refresh's preflight, which
  hashes every file: too costly for a page);
- ``invalid``: a broken marker or manifest, or a file the pipeline cannot read (the door's check);
- ``quarantined``: it took part in ``refresh.max_attempts`` refreshes of the champion that failed
  (``attempts``, the last one's failure summary), until a person releases it (``release``);
- ``new``: waiting for the next refresh (or for a first champion).

Reads only, except ``release``. The newest ``MAX_BATCHES`` are listed; the door's check reads every
file of a batch, so its answer is kept per batch (its manifest's sha256 is part of the key).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipelines import manifest, registry, storage
from pipelines.config import RunConfig
from pipelines.errors import BadInput
from pipelines.refresh import attempts, landing
from pipelines.refresh.landing import Batch
from pipelines.refresh.ledger import Ledger, of_version
from pipelines.run_folder import RunFolder, run_dir

MAX_BATCHES = 200  # batches listed, newest first
REFRESH_DAG = "taxiway_refresh"  # the DAG whose runs try batches: attempts.json records its run ids
_SHOWN = 5  # changed files named in one reason at most
STATES = ("new", "trained", "re-sent", "changed", "invalid", "quarantined")


class UnknownBatch(BadInput, LookupError):
    """No batch of that id in the landing zone (or not an id at all)."""


@dataclass(frozen=True)
class BatchRow:
    """One landed batch on the page: its state, why, and what it holds."""

    id: str
    state: str
    reason: str
    files: int | None = None
    bytes: int | None = None
    landed_at: str | None = None  # UTC ISO 8601, from the batch's marker
    trained_by: str | None = None  # models:/NAME/N
    attempts: tuple[str, ...] = ()  # refresh run ids that tried it against the champion
    last_failure: dict[str, Any] | None = None  # the last attempt's failure summary, when its run wrote one
    releases: tuple[dict[str, Any], ...] = ()  # who released it, when, and the attempts cleared

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "attempts": list(self.attempts), "releases": list(self.releases)}


@dataclass(frozen=True)
class Listing:
    """The landing zone as the page shows it: ``batches`` are one page (``limit``) of ``total``."""

    landing: str | None
    champion: str | None
    max_attempts: int
    batches: tuple[BatchRow, ...] = ()
    total: int = 0
    limit: int = MAX_BATCHES
    page: int = 0  # ``batches`` are the page-th ``limit`` of all, newest first

    def to_json(self) -> dict[str, Any]:
        return {"landing": self.landing, "champion": self.champion, "max_attempts": self.max_attempts,
                "total": self.total, "limit": self.limit, "page": self.page,
                "batches": [b.to_json() for b in self.batches]}


@dataclass(frozen=True)
class _Facts:
    """What the champion and the refresh state say about the landed batches."""

    cfg: RunConfig
    champion: str | None
    ledger: dict[str, dict[str, Any]]  # id → the champion's ledger row
    resent: dict[str, str]  # id → the trained batch it repeats
    changed: set[str]  # trained ids that came back with another manifest
    repeats: dict[str, str] = field(default_factory=dict)  # id → why every document repeats trained data
    tried: dict[str, list[str]] = field(default_factory=dict)
    releases: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def listing(cfg: RunConfig, limit: int = MAX_BATCHES, page: int = 0) -> Listing:
    """The batches in ``refresh.landing`` with their states, newest first: the ``page``-th ``limit`` of them."""
    zone = cfg.refresh.landing
    if not zone:
        return Listing(None, None, cfg.refresh.max_attempts, limit=limit, page=page)
    batches, invalid = landing.scan(zone)
    facts = _facts(cfg, batches)
    entries: list[tuple[str, str, Batch | str]] = [(b.landed_at, b.id, b) for b in batches]
    markers = {name: _marker(zone, name) for name, _ in invalid}
    entries += [(str(markers[name].get("landed_at", "")), name, why) for name, why in invalid]
    entries.sort(key=lambda e: (e[0], e[1]), reverse=True)
    rows = [_row(item, facts) if isinstance(item, Batch) else _invalid_row(zone, name, item, markers[name])
            for _, name, item in entries[page * limit:(page + 1) * limit]]
    return Listing(zone, facts.champion, cfg.refresh.max_attempts, tuple(rows), len(entries), limit, page)


def release(cfg: RunConfig, batch_id: str, who: str) -> dict[str, Any]:
    """Release the quarantined batch ``batch_id`` (its attempts against the champion cleared, so the
    next refresh tries it again; ``who`` and when recorded). ``UnknownBatch`` for an id the landing
    zone does not hold; ``attempts.NotQuarantined`` naming the batch's state for any other batch."""
    if not landing.BATCH_ID.fullmatch(batch_id):
        raise UnknownBatch("not a batch id (letters, digits, '.', '_' or '-', at most 128, not starting with a dot)")
    zone = cfg.refresh.landing
    batches, invalid = landing.scan(zone) if zone else ([], [])
    found = [b for b in batches if b.id == batch_id]
    if not found:
        if why := dict(invalid).get(batch_id):
            raise attempts.NotQuarantined(f"batch {batch_id} is invalid, not quarantined: {why}")
        raise UnknownBatch("no batch of that id in the landing zone")
    facts = _facts(cfg, batches)
    row = _row(found[0], facts)
    if row.state != "quarantined" or facts.champion is None:
        raise attempts.NotQuarantined(f"batch {batch_id} is {row.state}, not quarantined: {row.reason}")
    return attempts.release(found[0], facts.champion, who, cfg.refresh.max_attempts)


def _facts(cfg: RunConfig, batches: list[Batch]) -> _Facts:
    champion, ledger = _champion(cfg)
    triage = ledger.triage(batches)  # over every batch, oldest first: a second copy is a re-send
    facts = _Facts(cfg, champion, {r["id"]: r for r in ledger.batches}, {b.id: twin for b, twin in triage.resent},
                   {b.id for b in triage.changed}, releases=attempts.released(batches))
    if champion is None:
        return facts
    return replace(facts, repeats=attempts.repeats(triage.new, champion), tried=attempts.tried(triage.new, champion))


def _champion(cfg: RunConfig) -> tuple[str | None, Ledger]:
    """The champion as ``models:/NAME/N`` and its ledger (an empty one while there is none)."""
    reg, c = cfg.registry, registry.client()
    mv = registry.current_champion(c, reg.model_name, reg.champion_alias, missing_ok=True)
    if mv is None:
        return None, Ledger()
    with tempfile.TemporaryDirectory(prefix="taxiway-ledger-") as tmp:
        return f"models:/{mv.name}/{mv.version}", of_version(c, mv, Path(tmp))


def _row(batch: Batch, facts: _Facts) -> BatchRow:
    cfg, name = facts.cfg, facts.cfg.registry.model_name
    facts_of = {"files": batch.files, "bytes": batch.bytes, "landed_at": batch.landed_at,
                "releases": tuple(facts.releases.get(batch.id, ()))}
    trained = facts.ledger.get(batch.id)
    if batch.id in facts.changed:
        return BatchRow(batch.id, "changed", f"trained before by models:/{name}/{trained['version']} with another "
                        "manifest; land changed data under a new id", **facts_of)
    if trained is not None:
        return BatchRow(batch.id, "trained", f"in the ledger of the champion {facts.champion}",
                        trained_by=f"models:/{name}/{trained['version']}", **facts_of)
    if twin := facts.resent.get(batch.id):
        return BatchRow(batch.id, "re-sent", f"same manifest as trained batch {twin}", **facts_of)
    if why := facts.repeats.get(batch.id):
        return BatchRow(batch.id, "re-sent", why, **facts_of)
    if why := _changed_files(batch):
        return BatchRow(batch.id, "changed", why, **facts_of)
    if why := _unreadable(batch, cfg.data.format):
        return BatchRow(batch.id, "invalid", why, **facts_of)
    if facts.champion is None:
        return BatchRow(batch.id, "new", f"waiting for a champion: no version of {name} holds "
                        f"'{cfg.registry.champion_alias}'", **facts_of)
    runs = facts.tried.get(batch.id, [])
    failure = _last_failure(runs[-1]) if runs else None
    if len(runs) >= cfg.refresh.max_attempts:
        return BatchRow(batch.id, "quarantined", f"took part in {len(runs)} refresh(es) of {facts.champion} that did "
                        f"not make it champion; refresh.max_attempts is {cfg.refresh.max_attempts}",
                        attempts=tuple(runs), last_failure=failure, **facts_of)
    tried = f"; tried by {len(runs)} refresh(es) of it so far, next alone" if runs else ""
    return BatchRow(batch.id, "new", f"waiting for the next refresh of {facts.champion}{tried}",
                    attempts=tuple(runs), last_failure=failure, **facts_of)


def _invalid_row(zone: str, name: str, why: str, marker: dict[str, Any]) -> BatchRow:
    """A folder ``landing.scan`` found invalid: ``changed`` when its manifest no longer matches the marker."""
    sha = marker.get("manifest_sha256")
    try:
        changed = isinstance(sha, str) and storage.sha256(storage.locate(zone).join(name).join(landing.MANIFEST)) != sha
    except OSError:
        changed = False
    facts_of = {k: v for k, kind in (("files", int), ("bytes", int), ("landed_at", str))
                if isinstance(v := marker.get(k), kind) and not isinstance(v, bool)}
    return BatchRow(name, "changed" if changed else "invalid", why, **facts_of)


def _marker(zone: str, name: str) -> dict[str, Any]:
    """An invalid batch's marker as far as it reads (for its size and landing time), else nothing."""
    try:
        marker = json.loads(storage.read_bytes(storage.locate(zone).join(name).join(landing.MARKER)))
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def _changed_files(batch: Batch) -> str | None:
    """The batch's files whose size is no longer the manifest's (or that are gone), named."""
    root = storage.locate(batch.uri)
    try:
        entries = manifest.read(batch.manifest)
    except manifest.ManifestError:
        return None  # the door's check names it
    found = []
    for e in entries:
        try:
            size = storage.size(root.join(e.path))
        except OSError:
            found.append(f"{e.path} (gone)")
            continue
        if size != e.bytes:
            found.append(f"{e.path} ({size} bytes, the manifest says {e.bytes})")
    if not found:
        return None
    more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    return f"changed after landing: {', '.join(found[:_SHOWN])}{more}; land changed data as a new batch"


@lru_cache(maxsize=1024)
def _unreadable(batch: Batch, fmt: str | None) -> str | None:
    """The door's check (every file read as documents), once per batch and manifest."""
    return landing.unreadable_batch(batch, fmt)


def _last_failure(run_id: str) -> dict[str, Any]:
    """What the refresh run ``run_id`` wrote when it failed (stage, reason, next), if it did."""
    try:
        summary = json.loads(RunFolder(run_dir(REFRESH_DAG, run_id)).failure_summary.read_text())
    except (OSError, ValueError):
        summary = {}
    kept = {k: str(summary[k]) for k in ("stage", "task_id", "reason", "next") if isinstance(summary, dict) and k in summary}
    return {"run_id": run_id, **kept}
