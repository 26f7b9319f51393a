"""The ledger: which landed batches a model version was trained on, kept on the version itself.

A version made by a refresh is to carry ``refresh/ledger.json`` (every batch in its lineage: id,
manifest sha256, the version that first trained on it) as an artifact of its MLflow run and a tag
naming the batches new to it (``tags``), so the registry alone answers "what is new since the
champion". A version with no ledger (trained from scratch) has an empty one: every landed batch is
new to it. Whole batches are matched here by manifest sha256; single re-sent files are the
near-duplicate check's business (``signatures``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.errors import BadInput
from pipelines.refresh.landing import Batch
from pipelines.registry import client, with_retries
from pipelines.run_folder import RunFolder
from trainer import fsio

ARTIFACT = "refresh/ledger.json"
BATCHES_TAG = "taxiway.refresh.batches"
BASE_KEYS = ("train", "val", "manifest")


class LedgerError(BadInput):
    """A version's ledger that cannot be read; the message names the version."""


@dataclass(frozen=True)
class Triage:
    """What a refresh does with the landed batches, each decision with its reason."""

    new: list[Batch] = field(default_factory=list)
    resent: list[tuple[Batch, str]] = field(default_factory=list)  # (batch, id it repeats)
    changed: list[Batch] = field(default_factory=list)  # a trained id whose manifest differs now

    def summary(self) -> str:
        parts = [f"{len(self.new)} new batch(es)" + (f": {', '.join(b.id for b in self.new)}" if self.new else "")]
        parts += [f"{b.id} dropped: same manifest as already trained batch {twin}" for b, twin in self.resent]
        parts += [f"{b.id} skipped: trained before with another manifest; land changed data under a new id"
                  for b in self.changed]
        return "; ".join(parts)


@dataclass(frozen=True)
class Ledger:
    """Batches in a model's lineage, oldest first: ``{"id", "manifest_sha256", "version"}``."""

    batches: tuple[dict[str, str], ...] = ()
    base: dict[str, Any] | None = None  # the data section the lineage's first version was trained on

    def triage(self, landed: list[Batch]) -> Triage:
        """Split the landed batches: new ones, re-sends (same manifest under another id, never
        trained twice), and known ids whose manifest changed."""
        by_id = {b["id"]: b["manifest_sha256"] for b in self.batches}
        by_sha = {b["manifest_sha256"]: b["id"] for b in self.batches}
        triage = Triage()
        for batch in landed:
            if batch.id in by_id:
                if by_id[batch.id] != batch.manifest_sha256:
                    triage.changed.append(batch)
            elif batch.manifest_sha256 in by_sha:
                triage.resent.append((batch, by_sha[batch.manifest_sha256]))
            else:
                by_sha[batch.manifest_sha256] = batch.id  # a second copy in this same landing is a re-send too
                triage.new.append(batch)
        return triage

    def extended(self, new: list[Batch], version: str, trained: dict[str, list] | None = None) -> Ledger:
        """Add ``new`` as trained first by ``version``; ``trained`` (batch id → the train files it
        packed, ``[path, sha256, filtered]``) lets later refreshes replay exactly those."""
        return Ledger((*self.batches, *({**b.ref(), "version": version, "train": (trained or {}).get(b.id, [])}
                                        for b in new)), self.base)

    def to_json(self) -> str:
        return json.dumps({"base": self.base, "batches": list(self.batches)}, indent=1) + "\n"

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Ledger:
        try:
            doc = json.loads(data.decode("utf-8"))
            rows, base = doc["batches"], doc.get("base")
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
            raise LedgerError(f"{where}: not a Taxiway ledger (JSON with a 'batches' list)") from None
        if not isinstance(rows, list):
            raise LedgerError(f"{where}: 'batches' is not a list")
        if base is not None and not (isinstance(base, dict) and all(isinstance(base.get(k), str) for k in BASE_KEYS)):
            raise LedgerError(f"{where}: 'base' is not a data section with {', '.join(BASE_KEYS)}")
        for i, row in enumerate(rows):
            bad = [k for k in ("id", "manifest_sha256", "version") if not isinstance(row, dict) or not isinstance(row.get(k), str)]
            if bad:
                raise LedgerError(f"{where}: batches[{i}].{bad[0]} missing or not a string")
        return cls(tuple({**{k: row[k] for k in ("id", "manifest_sha256", "version")}, "train": row.get("train", [])}
                         for row in rows), base)


def tags(new: list[Batch]) -> dict[str, str]:
    """The version tag naming the batches new to it (the full list is the ledger artifact)."""
    return {BATCHES_TAG: ",".join(b.id for b in new) or "none"}


def of_version(c: Any, mv: Any, dest: Path) -> Ledger:
    """The ledger of a registered model version (``mv``), read from its run's artifact; for a version
    that no refresh made, no batches and the data it was trained on (its run's ``data.*`` params) as base."""
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): only a refresh's plan reads a ledger

    if not mv.run_id:
        return Ledger()
    if ARTIFACT not in {a.path for a in c.list_artifacts(mv.run_id, "refresh")}:
        return Ledger(base=trained_data(c.get_run(mv.run_id).data.params))
    try:
        local = c.download_artifacts(mv.run_id, ARTIFACT, str(dest))
    except MlflowException as exc:
        raise LedgerError(f"models:/{mv.name}/{mv.version}: cannot read {ARTIFACT} ({exc})") from None
    return Ledger.from_json(Path(local).read_bytes(), f"models:/{mv.name}/{mv.version} {ARTIFACT}")


def trained_data(params: dict[str, str]) -> dict[str, Any] | None:
    """The data section a run logged as params (``data.train`` …), or None when it logged none."""
    if not all(f"data.{k}" in params for k in BASE_KEYS):
        return None
    fmt = params.get("data.format", "None")
    return {**{k: params[f"data.{k}"] for k in BASE_KEYS}, "format": None if fmt == "None" else fmt}


def record(reg: Any, registered: Any, run_dir: Path, parent: Ledger, new: tuple[Batch, ...]) -> Ledger:
    """Put the refresh's ledger (the champion's, extended by this run's new batches) on the version it
    registered: ``refresh/ledger.json`` on its run, the batches tag on version and run. Done before any
    alias moves, so a champion always carries its ledger; repeating it is harmless."""
    assembled = json.loads(RunFolder(run_dir).refresh_assembled.read_text())
    trained = {b["batch"]: b["train"] for b in assembled["batches"] if b["train"]}
    new = [b for b in new if b.id in trained]  # a batch of repeats only was not trained
    ledger = parent.extended(new, registered.version, trained)
    path = fsio.write_text(RunFolder(run_dir).refresh_ledger, ledger.to_json())

    def write() -> None:
        c = client()
        c.log_artifact(registered.run_id, str(path), artifact_path=str(Path(ARTIFACT).parent))
        for key, value in tags(new).items():
            c.set_model_version_tag(registered.model_name, registered.version, key, value)
            c.set_tag(registered.run_id, key, value)

    with_retries(reg, "record the refresh ledger", write)
    return ledger
