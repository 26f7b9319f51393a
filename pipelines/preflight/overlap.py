"""Near-duplicate train/val overlap: vectorized MinHash signatures, an LSH index of band buckets
(datasketch ``MinHashLSH``'s bucket keys and query, on plain dicts), and exact confirmation.

Signatures are computed batch by batch in parallel worker processes (see ``minhash.py``), the
train split is indexed, each val document queries the index. A candidate whose estimated
Jaccard is within ``_PREFILTER`` of the threshold is confirmed by its exact shingle Jaccard
(both documents re-read); only confirmed pairs are reported. A val document with any confirmed
pair counts as contaminated. See ``minhash.py`` for how bands/rows follow from the threshold.
"""

from __future__ import annotations

import io
import os
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from pipelines import manifest, storage
from pipelines.config import RunConfig
from pipelines.documents import Record, file_format, records, split_files
from pipelines.preflight.forked import split_map
from pipelines.preflight.minhash import BATCH_BYTES, MinHasher, jaccard, lsh_params, shingle_sets, size_groups
from pipelines.preflight.report import CheckResult
from trainer import fsio

_PREFILTER = 0.1                 # confirm candidates with estimated J >= threshold - this (~3 sigma at 128 perms)
_EMPTY = np.iinfo(np.uint32).max  # signature of a document without shingles


def file_key(loc: storage.Location, root: storage.Location) -> str:
    """A file as the manifest spells paths (``train/a.txt``); its URI when outside the root."""
    try:
        return storage.relative(loc, root)
    except ValueError:
        return loc.uri()


def record_key(rec: Record, file: str) -> str:
    """A document id as the manifest spells paths (``train/a.txt``, ``val/b.jsonl#3``), given
    its file's ``file_key``."""
    return file + rec.doc_id[len(rec.file):]


def _sign_batch(files: list[storage.Location], *, fmt: str | None, hasher: MinHasher,
                root: storage.Location) -> Signed:
    """Signatures of every readable document in ``files`` (unreadable ones are the documents
    check's business and are skipped here)."""
    ids, texts = [], []
    for loc in files:
        key = file_key(loc, root)
        if file_format(loc, fmt) == "txt":  # one document per file: hash the bytes as they are
            ids.append(key)
            texts.append(storage.read_bytes(loc))
            continue
        for rec in records(loc, fmt):
            if rec.text is not None:
                ids.append(record_key(rec, key))
                texts.append(rec.text.encode())
    sigs = hasher.signatures(texts)
    return Signed(ids, sigs)


def _texts(keys: set[str], root: storage.Location, fmt: str | None) -> dict[str, str]:
    """Re-read just the documents named by ``keys`` (candidate pairs are few)."""
    by_file = defaultdict(set)
    for key in keys:
        by_file[key.partition("#")[0]].add(key)
    out = {}
    for rel, wanted in by_file.items():
        loc = root.join(rel) if "://" not in rel and not rel.startswith("/") else storage.locate(rel)
        fkey = file_key(loc, root)
        for rec in records(loc, fmt):
            key = record_key(rec, fkey)
            if key in wanted and rec.text is not None:
                out[key] = rec.text
    return out


@dataclass
class Signed:
    ids: list[str]          # document ids relative to the manifest root
    sigs: np.ndarray        # (n, num_perm) uint32

    @classmethod
    def join(cls, parts: list[Signed], num_perm: int) -> Signed:
        """One ``Signed`` of ``parts`` in order."""
        sigs = np.concatenate([v.sigs for v in parts]) if parts else np.empty((0, num_perm), np.uint32)
        return cls([k for v in parts for k in v.ids], sigs)


def band_hashes(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``(n, bands)`` uint64: each band's ``rows`` values folded into one number. A lookup key only:
    equal bands hash alike, and a hit is confirmed on the band's values themselves."""
    folded = np.zeros((len(sigs), bands), np.uint64)
    values = sigs[:, :bands * rows].reshape(len(sigs), bands, rows).astype(np.uint64)
    for k in range(rows):  # uint64 arithmetic wraps: a polynomial hash mod 2^64
        folded = folded * np.uint64(0x9E3779B97F4A7C15) + values[:, :, k]
    return folded


class TrainIndex:
    """The train split's LSH index. A val document's candidates are the train documents that share a
    whole band of their signatures with it — the candidates datasketch's ``MinHashLSH`` returns over the
    same signatures and bands (tests/test_preflight.py holds it to ``MinHashLSH.query``). Held as numpy
    arrays, per band the train documents' ``band_hashes`` sorted once for ``searchsorted``: 12 bytes
    per document and band, where a dict of bucket keys took about 3 KB per train document (150 MB at
    the 100x bench corpus) — and no datasketch import (scipy) on the stage's serial path."""

    def __init__(self, cfg: RunConfig) -> None:
        p = cfg.preflight
        self.bands, self.rows = lsh_params(p.overlap_jaccard, p.num_perm)
        self.ids: list[str] = []
        self.parts: list[np.ndarray] = []
        self._lookup: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # sigs, order, sorted hashes

    def add(self, batch: Signed) -> None:
        self.ids += batch.ids
        self.parts.append(batch.sigs)
        self._lookup = None

    def _sorted(self, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._lookup is None:
            sigs = np.concatenate(self.parts) if self.parts else np.empty((0, width), np.uint32)
            hashes = band_hashes(sigs, self.bands, self.rows)
            hashes[sigs[:, 0] == _EMPTY] = 0  # no shingles, never a candidate (masked again below)
            order = np.argsort(hashes, axis=0, kind="stable")
            self._lookup = sigs, order, np.take_along_axis(hashes, order, axis=0)
        return self._lookup

    def candidates(self, val: Signed, cutoff: float) -> tuple[list[tuple[str, str, float]], np.ndarray]:
        """(train, val, estimated Jaccard) for LSH hits at or above ``cutoff``; best estimate per val doc."""
        sigs, order, keys = self._sorted(val.sigs.shape[1])
        best = np.zeros(len(val.ids))
        wanted = band_hashes(val.sigs, self.bands, self.rows)
        found_v, found_t = [], []
        for b in range(self.bands):
            lo = np.searchsorted(keys[:, b], wanted[:, b], "left")
            counts = np.searchsorted(keys[:, b], wanted[:, b], "right") - lo
            if not counts.any():
                continue
            v = np.repeat(np.arange(len(val.ids)), counts)
            t = order[np.arange(counts.sum()) + np.repeat(lo - np.cumsum(counts) + counts, counts), b]
            band = slice(b * self.rows, (b + 1) * self.rows)
            same = (sigs[t, band] == val.sigs[v, band]).all(axis=1)  # the band itself, not just its hash
            found_v.append(v[same])
            found_t.append(t[same])
        if not found_v:
            return [], best
        pairs = np.unique(np.stack([np.concatenate(found_v), np.concatenate(found_t)], axis=1), axis=0)
        v, t = pairs[:, 0], pairs[:, 1]
        real = (sigs[t, 0] != _EMPTY) & (val.sigs[v, 0] != _EMPTY)
        v, t = v[real], t[real]
        est = (sigs[t] == val.sigs[v]).mean(axis=1)
        np.maximum.at(best, v, est)
        return [(self.ids[i], val.ids[j], float(e)) for j, i, e in zip(v, t, est, strict=True) if e >= cutoff], best


def index_and_sign(cfg: RunConfig, root: storage.Location, workers: int) -> tuple[TrainIndex, Signed]:
    """Sign train and val batches on ``workers`` processes (``forked.split_map``; processes, not
    threads: in development profiling two threads of one process slowed each other's numpy work,
    most likely through page faults and unmaps in the shared address space). The main process
    indexes each train batch as it comes; insertion order does not matter to the index."""
    p = cfg.preflight
    hasher = MinHasher(p.num_perm, p.shingle_words)
    train_batches = size_groups(split_files(cfg.data.train), storage.size, BATCH_BYTES)
    val_batches = size_groups(split_files(cfg.data.val), storage.size, BATCH_BYTES)
    index = TrainIndex(cfg)
    sign = partial(_sign_batch, fmt=cfg.data.format, hasher=hasher, root=root)
    val_signed: dict[int, Signed] = {}
    for i, signed in split_map(sign, train_batches + val_batches, workers):
        if i < len(train_batches):
            index.add(signed)
        else:
            val_signed[i] = signed
    return index, Signed.join([val_signed[i] for i in sorted(val_signed)], p.num_perm)


def sign_files(cfg: RunConfig, files: list[storage.Location], root: storage.Location, workers: int) -> Signed:
    """Signatures of the documents in ``files``, in file order, on ``workers`` processes."""
    p = cfg.preflight
    sign = partial(_sign_batch, fmt=cfg.data.format, hasher=MinHasher(p.num_perm, p.shingle_words), root=root)
    done = dict(split_map(sign, size_groups(files, storage.size, BATCH_BYTES), workers))
    return Signed.join([done[i] for i in sorted(done)], p.num_perm)


def confirm(candidates: list[tuple[str, str, float]], cfg: RunConfig, root: storage.Location) -> list[dict]:
    """Keep the candidates whose exact shingle Jaccard reaches the threshold (in the calling
    process: sending the shingle sets back from workers cost more than it saved)."""
    p = cfg.preflight
    texts = _texts({k for t, v, _ in candidates for k in (t, v)}, root, cfg.data.format)
    sets = shingle_sets([t.encode() for t in texts.values()], p.shingle_words)
    shingles = dict(zip(texts, sets, strict=True))
    pairs = []
    for t, v, e in candidates:
        exact = jaccard(shingles[t], shingles[v])
        if exact >= p.overlap_jaccard:
            pairs.append({"train": t, "val": v, "jaccard": round(exact, 4), "estimated": round(e, 4)})
    return sorted(pairs, key=lambda q: (q["val"], -q["jaccard"], q["train"]))


def check_overlap(cfg: RunConfig, plot_path: Path | None = None, workers: int | None = None) -> CheckResult:
    """The overlap check alone, reading the corpus itself (the stage gets its signatures from the
    shard scans instead: ``shards.py``, ``reduce.py``)."""
    workers = workers or cfg.preflight.workers or os.cpu_count() or 1
    root = manifest.root_of(cfg.data.manifest)
    index, val = index_and_sign(cfg, root, workers)
    return judge_overlap(cfg, index, val, root, plot_path)


def judge_overlap(cfg: RunConfig, index: TrainIndex, val: Signed, root: storage.Location,
                  plot_path: Path | None) -> CheckResult:
    """LSH candidates of every val document, confirmed by exact Jaccard; the plot; the verdict."""
    p = cfg.preflight
    if not val.ids:
        return CheckResult("overlap", False, "validation split has no readable documents", {})
    candidates, best = index.candidates(val, p.overlap_jaccard - _PREFILTER)
    pairs = confirm(candidates, cfg, root)
    contaminated = sorted({q["val"] for q in pairs})
    fraction = len(contaminated) / len(val.ids)
    if plot_path is not None:
        _plot(best, p.overlap_jaccard, plot_path)
    b, r = lsh_params(p.overlap_jaccard, p.num_perm)
    message = (f"{len(contaminated)}/{len(val.ids)} val documents ({fraction:.2%}) near-duplicate train "
               f"(Jaccard >= {p.overlap_jaccard}); limit {p.max_overlap_fraction:.2%}")
    return CheckResult("overlap", fraction <= p.max_overlap_fraction, message, {
        "contaminated_fraction": fraction, "contaminated": contaminated, "pairs": pairs,
        "val_documents": len(val.ids), "train_documents": len(index.ids),
        "jaccard_threshold": p.overlap_jaccard, "num_perm": p.num_perm, "shingle_words": p.shingle_words,
        "lsh_bands": b, "lsh_rows": r})


def warm() -> None:
    """Draw one throwaway plot (matplotlib loads fonts and its math-text parser on first use): half a
    second, spent by a caller that has time to spare before it judges (``stages.preflight.run``, while
    shards are scanned)."""
    _png(np.zeros(1), 0.5)


def _plot(best: np.ndarray, threshold: float, path: Path) -> None:
    fsio.write_bytes(path, _png(best, threshold))


def _png(best: np.ndarray, threshold: float) -> bytes:
    """Histogram of each val document's best estimated Jaccard against train."""
    import matplotlib  # matplotlib (~0.13 s): DAG parse must not pay for it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): the backend is chosen before pyplot loads

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(best, bins=20, range=(0, 1), color="#4477aa")
    ax.axvline(threshold, color="#cc3311", linestyle="--", label=f"threshold {threshold}")
    ax.set_xlabel("best estimated Jaccard vs train (LSH candidates; 0 = none)")
    ax.set_ylabel("val documents")
    ax.set_yscale("symlog")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
