"""Token streams cached per group of input files, so an unchanged file is never tokenized twice.

Files (sorted by manifest path) are cut into groups at content-defined boundaries: a group ends
after a file whose path hash is 0 mod ``_SPREAD``. Adding or changing a file therefore changes
only the key of the group it falls in; every other group is a cache hit. A group's key hashes
the tokenizer's sha256, the data format, the format version and each file's (path, sha256).
A group's stream is its documents' token ids, each followed by EOS, with the offsets where
documents start.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from pipelines import storage
from pipelines.documents import read_documents
from pipelines.run_folder import Cache
from pipelines.tokenize.engine import Encode
from trainer import fsio

FORMAT_VERSION = 2  # 2: special-token text inside documents is encoded as text
_SPREAD = 32          # about 32 files per group
_BATCH_DOCS = 512     # documents per encode_batch call, at most ...
_BATCH_CHARS = 1 << 20  # ... and about this much text: Python id lists cost ~36 B per token


@dataclass(frozen=True)
class FileRef:
    path: str                  # as in the manifest
    sha256: str
    loc: storage.Location


@dataclass(frozen=True)
class Stream:
    tokens: np.ndarray         # ids, EOS after each document
    starts: np.ndarray         # int64 offsets where documents start
    chars: int
    cache_hit: bool


def split_groups(files: list[FileRef]) -> list[list[FileRef]]:
    groups, current = [], []
    for ref in sorted(files, key=lambda f: f.path):
        current.append(ref)
        if int(hashlib.blake2b(ref.path.encode(), digest_size=4).hexdigest(), 16) % _SPREAD == 0:
            groups.append(current)
            current = []
    return groups + ([current] if current else [])


def group_key(group: list[FileRef], tokenizer_sha256: str, data_format: str | None, dtype: np.dtype) -> str:
    material = [FORMAT_VERSION, tokenizer_sha256, data_format, dtype.name, [(f.path, f.sha256) for f in group]]
    return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]


def _encode(texts: list[str], encode: Encode, eos: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    ids = encode(texts)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)) + 1
    ends = np.cumsum(lengths)
    out = np.full(int(ends[-1]) if len(ends) else 0, eos, dtype=dtype)
    keep = np.ones(len(out), dtype=bool)
    keep[ends - 1] = False
    out[keep] = np.fromiter((i for doc in ids for i in doc), dtype=dtype, count=int(keep.sum()))
    return out, ends - lengths


def tokenize_group(group: list[FileRef], encode: Encode, tokenizer_sha256: str, eos: int, dtype: np.dtype,
                   data_format: str | None, cache: Cache) -> Stream:
    folder = cache.tokens(group_key(group, tokenizer_sha256, data_format, dtype))
    if (folder / "meta.json").is_file():
        meta = json.loads((folder / "meta.json").read_text())
        return Stream(np.load(folder / "tokens.npy"), np.load(folder / "starts.npy"),
                      meta["chars"], True)
    parts, starts, offset, chars, batch, pending = [], [], 0, 0, [], 0

    def flush() -> None:
        nonlocal offset, pending
        tokens, doc_starts = _encode(batch, encode, eos, dtype)
        parts.append(tokens)
        starts.append(doc_starts + offset)
        offset += len(tokens)
        batch.clear()
        pending = 0

    for ref in group:
        for _, text in read_documents(ref.loc, data_format):
            batch.append(text)
            chars += len(text)
            pending += len(text)
            if len(batch) == _BATCH_DOCS or pending >= _BATCH_CHARS:
                flush()
    if batch:
        flush()
    tokens = np.concatenate(parts) if parts else np.empty(0, dtype)
    doc_starts = np.concatenate(starts) if starts else np.empty(0, np.int64)
    with fsio.staged_dir(folder) as stage:
        np.save(stage / "tokens.npy", tokens)
        np.save(stage / "starts.npy", doc_starts)
        fsio.write_json(stage / "meta.json", {"files": [f.path for f in group], "documents": len(doc_starts),
                                                "tokens": len(tokens), "chars": chars})
    return Stream(tokens, doc_starts, chars, False)
