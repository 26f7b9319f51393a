"""The refresh run's dataset, assembled in its run folder from the plan's new batches.

``<run>/refresh/data/`` (written staged, renamed into place; ``assembled.json`` says what was done)::

    batches/<batch id>/train/...   new train documents: files linked, or copied without the
                                   documents that repeat trained data
    <val as in the base manifest>  the fixed validation set, linked under its own manifest paths,
                                   so its token groups are cache hits and both models read the
                                   same windows
    fresh/<batch id>/...           held-out new documents: the batch's val/, else a seeded share
                                   (``refresh.fresh_eval_fraction``) of its train files
    manifest.jsonl                 train + val, for the standard preflight checks
    fresh.jsonl                    the held-out files (as split "val"), for the refresh gate
    earlier/<batch id>/...         held-out files of earlier batches in the champion's ledger (newest
    earlier-<batch id>.jsonl       first, at most ``refresh.forgetting_batches``), recovered as their
                                   refresh held them out: scored parent vs candidate to show forgetting

A new document that is a near-duplicate (MinHash estimate at or above
``preflight.overlap_jaccard``, exact copies included) of anything the champion was trained on is
dropped and reported, never trained twice; so is a held-out document that repeats a trained one or
one trained now (the new-data gate must judge unseen text). The index of trained documents is
filled from stored signatures (``signatures.py``): no old document is read, only new batches are
signed.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from pathlib import Path

from pipelines import manifest, storage
from pipelines.config import DataConfig, RunConfig
from pipelines.documents import file_format
from pipelines.errors import BadInput
from pipelines.preflight.decontaminate import filtered
from pipelines.preflight.overlap import Signed, sign_files
from pipelines.refresh import attempts, signatures
from pipelines.refresh.landing import MANIFEST, Batch
from pipelines.refresh.layout import EARLIER, FRESH, NEW, layout
from pipelines.refresh.plan import RefreshPlan
from pipelines.run_folder import RunFolder
from trainer import fsio


class NothingNew(Exception):
    """Every new document repeats trained data: the refresh has nothing to train (skipped, not failed)."""


def _place(dest: Path, src: storage.Location) -> None:
    """A local file is linked (nothing is copied); a remote one is copied."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.local:
        os.symlink(src.path, dest)
    else:
        dest.write_bytes(storage.read_bytes(src))


def _held_out(batch_id: str, train: list[manifest.Entry], fraction: float, seed: int) -> set[str]:
    """A seeded share of a batch's train files, for a batch that brings no val/ of its own: a pure
    function of (seed, batch id, paths, fraction), so a later refresh recovers it (``_earlier``)."""
    if len(train) < 2:
        raise BadInput(f"batch {batch_id}: one train file and no val/: nothing can be held out to judge the "
                       "refresh on new data; land a val/ folder or more files")
    rank = sorted(train, key=lambda e: hashlib.sha256(f"{seed} {batch_id} {e.path}".encode()).hexdigest())
    return {e.path for e in rank[:min(len(train) - 1, math.ceil(fraction * len(train)))]}


def _trained_sources(plan: RefreshPlan, base: DataConfig) -> list[tuple[str, str, str | None]]:
    """(label, manifest, its sha256 when known) of everything the champion was trained on: the base
    corpus and its ledger's batches (found by sha256 in the signature store, even once deleted)."""
    zone = storage.locate(plan.landing)
    return [("base", base.manifest, None)] + [(b["id"], zone.join(f"{b['id']}/{MANIFEST}").uri(), b["manifest_sha256"])
                                              for b in plan.ledger]


def _repeats(cfg: RunConfig, index, batch: Batch) -> tuple[dict[str, tuple[str, float]], Signed]:
    """New train documents of ``batch`` that repeat documents in ``index`` (trained ones, and those
    of the new batches before it): doc id → (that document, estimate); and the batch's signatures,
    which are stored for the refreshes after this one."""
    new, _ = signatures.train_signatures(cfg, batch.manifest)
    found: dict[str, tuple[str, float]] = {}
    for trained, doc, est in index.candidates(new, cfg.preflight.overlap_jaccard)[0]:
        if est > found.get(doc, ("", -1.0))[1]:
            found[doc] = (trained, est)
    return found, new


def _kept_docs(signed: Signed, files: set[str], dropped: set[str]) -> Signed:
    """The signatures of the documents this refresh trains on (of ``files``, not ``dropped``)."""
    rows = [i for i, d in enumerate(signed.ids) if d.split("#", 1)[0] in files and d not in dropped]
    return Signed([signed.ids[i] for i in rows], signed.sigs[rows])


def assemble(cfg: RunConfig, run_dir: Path, plan: RefreshPlan) -> dict:
    """Build ``refresh/data/`` for the plan's new batches; returns (and writes) ``assembled.json``."""
    base = plan.base
    out = layout(base, run_dir)
    base_root = manifest.root_of(base.manifest)
    index, signed = signatures.trained_index(cfg, _trained_sources(plan, base))
    train_entries, fresh_entries, report = [], [], []
    pending: dict[str, tuple[storage.Location, list[manifest.Entry]]] = {}  # held-out files per batch
    shutil.rmtree(out.root, ignore_errors=True)  # an earlier try's, whole or not
    with fsio.staged_dir(out.root) as stage:
        val = [e for e in manifest.read(base.manifest) if e.split == "val"]
        for e in val:
            _place(stage / e.path, base_root.join(e.path))
        for batch in plan.new:
            root = storage.locate(batch.uri)
            entries = manifest.read(batch.manifest)
            train = [e for e in entries if e.split == "train"]
            own_val = [e for e in entries if e.split == "val"]
            held = {e.path for e in own_val} or _held_out(batch.id, train, cfg.refresh.fresh_eval_fraction, cfg.train.seed)
            repeats, signed_batch = _repeats(cfg, index, batch)
            dropped, kept = [], []  # kept: [path in batch, sha256 as packed, filtered]
            for e in entries:
                rel = f"{batch.id}/{e.path}"
                if e.path in held:
                    pending.setdefault(batch.id, (root, []))[1].append(e)
                    continue
                src, dest = root.join(e.path), stage / NEW / rel
                drop = {d for d in repeats if d == e.path or d.startswith(e.path + "#")}
                if not drop:
                    _place(dest, src)
                    train_entries.append(manifest.Entry(f"{NEW}/{rel}", "train", e.bytes, e.sha256))
                    kept.append([e.path, e.sha256, False])
                    continue
                dropped += [{"document": f"{batch.id}/{d}", "repeats": repeats[d][0], "jaccard": round(repeats[d][1], 3)}
                            for d in sorted(drop)]
                data, _ = filtered(src, file_format(src, cfg.data.format), drop, root)
                if data is not None:
                    fsio.write_bytes(dest, data)
                    train_entries.append(manifest.Entry(f"{NEW}/{rel}", "train", len(data), fsio.sha256_file(dest)))
                    kept.append([e.path, train_entries[-1].sha256, True])
            if not kept:  # nothing new in it: dropped like a re-send, for this champion and the next plans
                attempts.record_repeat(batch, plan.champion, f"every train document repeats trained data "
                                       f"({len(dropped)} document(s); see {RunFolder(run_dir).refresh_assembled})")
                pending.pop(batch.id, None)
            index.add(signatures.labelled(_kept_docs(signed_batch, {k[0] for k in kept}, set(repeats)), batch.id))
            report.append({"batch": batch.id, "train_files": len(kept), "train": kept, "held_out_files": len(held),
                           "held_out_from": "val/" if own_val else "train", "dropped_documents": dropped})
        for batch_report in report:
            root, held_entries = pending.get(batch_report["batch"], (None, []))
            batch_report["held_out_dropped"] = _place_fresh(cfg, index, stage, batch_report["batch"], root, held_entries,
                                                           fresh_entries)
        earlier, left_out = _earlier(cfg, plan, stage)
        if not train_entries:
            raise NothingNew(f"nothing to train on: every new train document of {', '.join(b['batch'] for b in report)} "
                             "repeats data the champion was trained on (dropped as re-sends; assembled.json lists each)")
        manifest.write(stage / "manifest.jsonl", train_entries + [manifest.Entry(e.path, "val", e.bytes, e.sha256)
                                                                  for e in val])
        manifest.write(stage / "fresh.jsonl", fresh_entries)
    summary = {"batches": report, "trained_sources_signed_now": signed, "train_files": len(train_entries), "fresh_files": len(fresh_entries),
               "dropped_documents": sum(len(b["dropped_documents"]) for b in report),
               "earlier": earlier, "earlier_left_out": left_out}
    fsio.write_json(RunFolder(run_dir).refresh_assembled, summary)
    return summary


def _earlier_slice(cfg: RunConfig, row: dict, zone: storage.Location) -> tuple[list[manifest.Entry], str, str]:
    """An earlier batch's held-out files as its refresh held them out (its val/, else ``_held_out``
    with this deployment's seed and fraction, checked against the files its ledger row says were
    trained), where they came from, and why none when they cannot be recovered."""
    found = zone.join(f"{row['id']}/{MANIFEST}")
    if not storage.exists(found):
        return [], "", "no longer in the landing zone"
    if storage.sha256(found) != row["manifest_sha256"]:
        return [], "", "its manifest changed since it was trained"
    entries = manifest.read(found.uri())
    if own_val := [e for e in entries if e.split == "val"]:
        return own_val, "val/", ""
    train = [e for e in entries if e.split == "train"]
    held = _held_out(row["id"], train, cfg.refresh.fresh_eval_fraction, cfg.train.seed) if len(train) > 1 else set()
    if not held or held & {path for path, _, _ in row.get("train", [])}:
        return [], "", ("its held-out files cannot be recovered: refresh.fresh_eval_fraction or train.seed "
                        "changed since it was trained")
    return [e for e in train if e.path in held], "train", ""


def _earlier(cfg: RunConfig, plan: RefreshPlan, stage: Path) -> tuple[list[dict], list[dict]]:
    """Place the held-out slices of the batches the champion was trained on, newest first, at most
    ``refresh.forgetting_batches``, as landed (the trained index holds each batch's whole manifest, so
    it cannot filter them again); returns those placed and those left out, with why."""
    zone, n = storage.locate(plan.landing), cfg.refresh.forgetting_batches
    rows = list(reversed(plan.ledger))
    placed = []
    left_out = [{"batch": row["id"], "reason": f"beyond refresh.forgetting_batches ({n}), newest first"}
                for row in rows[n:]]
    for row in rows[:n]:
        held, origin, why = _earlier_slice(cfg, row, zone)
        if not held:
            left_out.append({"batch": row["id"], "reason": why})
            continue
        for e in held:
            _place(stage / EARLIER / row["id"] / e.path, zone.join(f"{row['id']}/{e.path}"))
        manifest.write(stage / f"{EARLIER}-{row['id']}.jsonl",
                       [manifest.Entry(f"{EARLIER}/{row['id']}/{e.path}", "val", e.bytes, e.sha256) for e in held])
        placed.append({"batch": row["id"], "version": row["version"], "files": len(held), "held_out_from": origin})
    return placed, left_out


def _place_fresh(cfg: RunConfig, index, stage: Path, batch_id: str, root: storage.Location | None,
                 held: list[manifest.Entry], out: list[manifest.Entry]) -> list[dict]:
    """Place a batch's held-out files under ``fresh/``, without documents that repeat a document
    trained on or trained now (the new data gate must judge unseen text); returns those dropped."""
    if not held:
        return []
    workers = cfg.preflight.workers or os.cpu_count() or 1
    signed = sign_files(cfg, [root.join(e.path) for e in held], root, workers)
    hits: dict[str, tuple[str, float]] = {}
    for other, doc, est in index.candidates(signed, cfg.preflight.overlap_jaccard)[0]:
        if est > hits.get(doc, ("", -1.0))[1]:
            hits[doc] = (other, est)
    dropped = []
    for e in held:
        rel, src = f"{batch_id}/{e.path}", root.join(e.path)
        drop = {d for d in hits if d == e.path or d.startswith(e.path + "#")}
        if not drop:
            _place(stage / FRESH / rel, src)
            out.append(manifest.Entry(f"{FRESH}/{rel}", "val", e.bytes, e.sha256))
            continue
        dropped += [{"document": f"{batch_id}/{d}", "repeats": hits[d][0], "jaccard": round(hits[d][1], 3)}
                    for d in sorted(drop)]
        data, _ = filtered(src, file_format(src, cfg.data.format), drop, root)
        if data is not None:
            fsio.write_bytes(stage / FRESH / rel, data)
            out.append(manifest.Entry(f"{FRESH}/{rel}", "val", len(data), fsio.sha256_file(stage / FRESH / rel)))
    return dropped
