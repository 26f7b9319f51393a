"""MinHash signatures of trained data, stored once per source, so a refresh signs only what is new.

A source is the train split of a manifest (a landed batch, or the corpus a model was first trained
on), keyed by the manifest's sha256 and the MinHash parameters. Its signatures are written once,
atomically, to ``<cache>/signatures/<params>/<manifest sha256>.npz``. The near-duplicate index of
everything a model was trained on is filled from those files (bucket keys are recomputed from the
signatures in a few numpy calls), so no old document is ever read again: each refresh extends the
stored set by its new batches.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from pipelines import manifest
from pipelines.config import RunConfig
from pipelines.preflight.overlap import Signed, TrainIndex, sign_files
from pipelines.run_folder import Cache, cache_dir
from trainer import fsio

VERSION = 1  # of the shingling and hashing; a change makes earlier signatures unusable


def params_key(cfg: RunConfig) -> str:
    """What shapes a signature: the hashing version, its parameters, and how files split into documents."""
    p = cfg.preflight
    return f"v{VERSION}-perm{p.num_perm}-w{p.shingle_words}-{cfg.data.format or 'byext'}"


def path_of(cfg: RunConfig, manifest_sha256: str) -> Path:
    return Cache(cache_dir()).signatures(params_key(cfg)) / f"{manifest_sha256}.npz"


def train_signatures(cfg: RunConfig, manifest_uri: str, workers: int | None = None,
                     manifest_sha256: str | None = None) -> tuple[Signed, bool]:
    """The signatures of the train documents ``manifest_uri`` lists, and whether they were
    stored already (True: nothing was read; with ``manifest_sha256`` given, not even the manifest,
    which may be gone by then)."""
    p = cfg.preflight
    path = path_of(cfg, manifest_sha256 or manifest.digest(manifest_uri))
    if path.exists():
        with np.load(path, allow_pickle=False) as saved:
            ids, sigs = saved["ids"].tolist(), saved["sigs"]
        return Signed(ids, sigs), True
    root = manifest.root_of(manifest_uri)
    files = [root.join(e.path) for e in manifest.read(manifest_uri) if e.split == "train"]
    signed = sign_files(cfg, files, root, workers or p.workers or os.cpu_count() or 1)
    buf = io.BytesIO()
    np.savez(buf, ids=np.array(signed.ids, dtype=str), sigs=signed.sigs)
    fsio.write_bytes(path, buf.getvalue())
    return signed, False


def labelled(signed: Signed, label: str) -> Signed:
    """Document ids made unique across sources: ``<label>:<id>``."""
    return Signed([f"{label}:{i}" for i in signed.ids], signed.sigs)


def trained_index(cfg: RunConfig, sources: list[tuple[str, str, str | None]],
                  workers: int | None = None) -> tuple[TrainIndex, int]:
    """The index of every source's train documents (``(label, manifest, manifest sha256 if known)``)
    and how many sources had to be signed (0 once every one is stored)."""
    index, signed_now = TrainIndex(cfg), 0
    for label, uri, sha in sources:
        signed, stored = train_signatures(cfg, uri, workers, sha)
        index.add(labelled(signed, label))
        signed_now += not stored
    return index, signed_now
