"""Preflight shards: the corpus cut into groups of files that are scanned independently.

``plan`` lists both splits' files (train, then val, each sorted as ``split_files`` sorts them)
and cuts them into shards of about ``preflight.shard_bytes`` at content-defined boundaries: once a
shard holds half the target, it ends after a file whose key hashes below ``2 * bytes / target``
(so a byte ends a shard with the same odds wherever it lies), and at twice the target at the
latest. Adding or changing a file therefore changes the shards near it, not every later one. A
shard never spans both splits. Concatenated in order, the shards list the files in the order the
checks have always read them, so the reduce reproduces the unsharded results exactly.

``scan`` reads each file of a shard once and computes everything the checks need: size and
sha256 (manifest), one row per document (documents), the normalized-text hash of each readable
document (duplicates), MinHash signatures (overlap). Its result is content-addressed: the key
hashes the format version, the settings that shape it and each file's (key, sha256), so a retried
or re-run shard with unchanged files loads ``<cache>/preflight/<key>/`` instead of redoing the
work (hashing the files to find the key is the only repeated cost).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines import manifest, storage
from pipelines.config import RunConfig
from pipelines.documents import file_format, parse, split_files
from pipelines.preflight.duplicates import normalized_hash
from pipelines.preflight.minhash import BATCH_BYTES, MinHasher, size_groups
from pipelines.preflight.overlap import file_key, record_key
from pipelines.run_folder import Cache, RunFolder, cache_dir
from trainer import fsio

FORMAT_VERSION = 1  # of the shard result (rows, hash normalization, shingling); a change invalidates entries


@dataclass(frozen=True)
class ShardFile:
    key: str     # as the manifest spells it (``file_key``)
    uri: str
    path: str    # path inside its filesystem, as ``storage.list_files`` gave it
    bytes: int


@dataclass(frozen=True)
class Shard:
    id: int
    split: str
    files: list[ShardFile]

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Shard:
        return cls(obj["id"], obj["split"], [ShardFile(**f) for f in obj["files"]])


@dataclass
class ShardResult:
    key: str
    cache_hit: bool
    split: str
    files: list[list]              # per file, in shard order: [key, bytes, sha256]
    rows: list[dict[str, Any]]     # per document: split, doc_id, n_bytes, n_chars, problem
    digests: list[list[str]]       # per readable document: [doc_id, normalized-text hash]
    ids: list[str]                 # signed documents, in order
    sigs: np.ndarray               # (len(ids), num_perm) uint32


def _ends_shard(key: str, size: int, total: int, target: int) -> bool:
    if total < target // 2:
        return False
    draw = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64
    return draw < 2 * size / target or total >= 2 * target


def plan(cfg: RunConfig, min_shards: int = 1, max_shards: int | None = None) -> list[Shard]:
    """The shards of both splits, numbered from 0 in file order: about ``preflight.shard_bytes``
    each, smaller when that makes fewer than ``min_shards`` (N processes each want a few, so they
    finish together), larger past ``max_shards`` (Airflow fails a task mapped wider than ``[core]
    max_map_length``)."""
    root = manifest.root_of(cfg.data.manifest)
    files = {split: [ShardFile(file_key(loc, root), loc.uri(), loc.path, storage.size(loc))
                     for loc in split_files(getattr(cfg.data, split))] for split in manifest.SPLITS}
    total = sum(f.bytes for split in files.values() for f in split)
    target = cfg.preflight.shard_bytes if min_shards <= 1 else max(1, min(cfg.preflight.shard_bytes, total // min_shards))
    shards = _cut(files, target)
    while max_shards and len(shards) > max(max_shards, len(manifest.SPLITS)):
        target += max(1, target // 8)
        shards = _cut(files, target)
    return shards


def _cut(files: dict[str, list[ShardFile]], target: int) -> list[Shard]:
    shards: list[Shard] = []
    for split, split_files_ in files.items():
        current, total = [], 0
        for f in split_files_:
            current.append(f)
            total += f.bytes
            if _ends_shard(f.key, f.bytes, total, target):
                shards.append(Shard(len(shards), split, current))
                current, total = [], 0
        if current:
            shards.append(Shard(len(shards), split, current))
    return shards


def write_plan(run_dir: Path, shards: list[Shard]) -> None:
    """Compact JSON: a line per file of the corpus would cost the Python encoder's time (``indent``)."""
    fsio.write_text(RunFolder(run_dir).preflight_plan, json.dumps({"shards": [s.to_json() for s in shards]}))


def read_plan(run_dir: Path) -> list[Shard]:
    return [Shard.from_json(s) for s in json.loads(RunFolder(run_dir).preflight_plan.read_text())["shards"]]


def shard_key(cfg: RunConfig, split: str, files: list[list]) -> str:
    p = cfg.preflight
    material = [FORMAT_VERSION, p.num_perm, p.shingle_words, cfg.data.format, split,
                [(key, sha) for key, _, sha in files]]
    return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]


def scan(cfg: RunConfig, shard: Shard) -> ShardResult:
    """The shard's result: from the cache when its files are unchanged, else computed and cached."""
    base = storage.locate(shard.files[0].uri)  # one split's files: one filesystem (locating each costs a resolve)
    locs = [dataclasses.replace(base, path=f.path) for f in shard.files]
    raws = [storage.read_bytes(loc) for loc in locs]
    files = [[f.key, len(raw), hashlib.sha256(raw).hexdigest()] for f, raw in zip(shard.files, raws, strict=True)]
    key = shard_key(cfg, shard.split, files)
    folder = Cache(cache_dir()).preflight_shard(key)
    if (folder / "result.json").is_file():
        return load(key)
    result = _compute(cfg, shard, locs, raws, files, key)
    with fsio.staged_dir(folder) as stage:
        fsio.write_bytes(stage / "signatures.npz", _npz(result.ids, result.sigs), durable=False)
        # written last: its presence marks a complete entry (staged_dir renames the whole folder anyway)
        fsio.write_text(stage / "result.json", json.dumps({  # compact: json's C encoder only runs without indent
            "split": result.split, "files": result.files, "rows": result.rows, "digests": result.digests}), durable=False)
    return result


def _npz(ids: list[str], sigs: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, ids=np.array(ids, dtype=str), sigs=sigs)
    return buf.getvalue()


def load(key: str) -> ShardResult:
    """A cached shard result (written by ``scan``)."""
    folder = Cache(cache_dir()).preflight_shard(key)
    saved = json.loads((folder / "result.json").read_text())
    with np.load(folder / "signatures.npz", allow_pickle=False) as npz:
        ids, sigs = npz["ids"].tolist(), npz["sigs"]
    return ShardResult(key, True, saved["split"], saved["files"], saved["rows"], saved["digests"], ids, sigs)


def _compute(cfg: RunConfig, shard: Shard, locs: list[storage.Location], raws: list[bytes], files: list[list],
             key: str) -> ShardResult:
    """Rows, hashes and signatures of the shard's documents, from the bytes already read. What is
    signed matches the overlap check: a txt file's bytes as they are (even when they do not decode:
    unreadable documents are the documents check's business), else each readable record's text."""
    fmt, p = cfg.data.format, cfg.preflight
    rows, digests, ids, texts = [], [], [], []
    for f, loc, raw in zip(shard.files, locs, raws, strict=True):
        kind = file_format(loc, fmt)
        whole_file = kind == "txt"
        for rec in parse(raw, loc, kind):
            doc = record_key(rec, f.key)
            rows.append({"split": shard.split, "doc_id": doc, "n_bytes": rec.n_bytes,
                         "n_chars": len(rec.text) if rec.text is not None else None, "problem": rec.problem})
            if rec.text is not None:
                digests.append([doc, normalized_hash(rec.text)])
            if whole_file or rec.text is not None:
                ids.append(doc)
                texts.append(raw if whole_file else rec.text.encode())
    hasher = MinHasher(p.num_perm, p.shingle_words)
    parts = [hasher.signatures(batch) for batch in size_groups(texts, len, BATCH_BYTES)]
    sigs = np.concatenate(parts) if parts else np.empty((0, p.num_perm), np.uint32)
    return ShardResult(key, False, shard.split, files, rows, digests, ids, sigs)
