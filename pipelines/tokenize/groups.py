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
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelines import storage
from pipelines.documents import read_documents
from pipelines.run_folder import Cache
from pipelines.tokenize.engine import Encoder
from trainer import fsio

FORMAT_VERSION = 2  # 2: special-token text inside documents is encoded as text
_SPREAD = 32          # about 32 files per group
_BATCH_DOCS = 512     # documents per encode_batch call, at most ...
_BATCH_CHARS = 1 << 20  # ... and about this much text: Python id lists cost ~36 B per token
_AHEAD = 3              # batches encoding at once (the engine queues their documents on its own threads)


@dataclass(frozen=True, slots=True)
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


def _encode(texts: list[str], encode: Encoder, eos: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """One batch as a flat token array (EOS after each document) and its document offsets."""
    arrays = encode.arrays(texts)
    lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)) + 1
    ends = np.cumsum(lengths)
    sep = np.array([eos], dtype=dtype)
    # ids fit dtype (dtype_for sizes it by the vocabulary), so the same-kind downcast is exact
    pieces = [piece for ids in arrays for piece in (ids, sep)]
    out = np.concatenate(pieces, dtype=dtype, casting="same_kind") if pieces else np.empty(0, dtype)
    return out, ends - lengths


def tokenize_group(group: list[FileRef], encode: Encoder, tokenizer_sha256: str, eos: int, dtype: np.dtype,
                   data_format: str | None, cache: Cache) -> Stream:
    return next(tokenize_groups([group], encode, tokenizer_sha256, eos, dtype, data_format, cache))


@dataclass
class _Pending:
    """A group being encoded: its cache folder, its batches in order, and what it read."""

    folder: Path
    files: list[str]
    batches: list[Future] = field(default_factory=list)
    chars: int = 0


def tokenize_groups(groups: list[list[FileRef]], encode: Encoder, tokenizer_sha256: str, eos: int,
                    dtype: np.dtype, data_format: str | None, cache: Cache) -> Iterator[Stream]:
    """Each group's stream, in order: from the cache, else encoded and cached.

    Batches are encoded (and flattened) on background threads up to ``_AHEAD`` batches ahead of
    the group being finished, across group boundaries, so the engine always has the next batch
    queued while this thread reads files, concatenates, writes the cache and packs; encoding one
    group at a time left the cores idle for all of that and for each batch's slowest document.
    """
    pending: deque[_Pending | Stream] = deque()
    with ThreadPoolExecutor(_AHEAD, thread_name_prefix="taxiway-encode") as pool:
        inflight: set[Future] = set()

        def submit(batch: list[str]) -> Future:
            nonlocal inflight
            while len(inflight) >= _AHEAD:
                _, inflight = wait(inflight, return_when=FIRST_COMPLETED)
            future = pool.submit(_encode, batch, encode, eos, dtype)
            inflight.add(future)
            return future

        for group in groups:
            folder = cache.tokens(group_key(group, tokenizer_sha256, data_format, dtype))
            if (folder / "meta.json").is_file():
                meta = json.loads((folder / "meta.json").read_text())
                pending.append(Stream(np.load(folder / "tokens.npy"), np.load(folder / "starts.npy"),
                                      meta["chars"], True))
            else:
                pending.append(_read(group, folder, data_format, submit))
            while len(pending) > 1:
                yield _finish(pending.popleft(), dtype)
        while pending:
            yield _finish(pending.popleft(), dtype)


def _read(group: list[FileRef], folder: Path, data_format: str | None,
          submit: Callable[[list[str]], Future]) -> _Pending:
    """Read ``group``'s documents and submit them in batches of ``_BATCH_DOCS`` / ``_BATCH_CHARS``."""
    job, batch, pending = _Pending(folder, [f.path for f in group]), [], 0
    for ref in group:
        for _, text in read_documents(ref.loc, data_format, ref.sha256):
            batch.append(text)
            job.chars += len(text)
            pending += len(text)
            if len(batch) == _BATCH_DOCS or pending >= _BATCH_CHARS:
                job.batches.append(submit(batch))
                batch, pending = [], 0
    if batch:
        job.batches.append(submit(batch))
    return job


def _finish(job: _Pending | Stream, dtype: np.dtype) -> Stream:
    """The group's stream once its batches are encoded, written to the cache."""
    if isinstance(job, Stream):
        return job
    parts, starts, offset = [], [], 0
    for future in job.batches:
        tokens, doc_starts = future.result()
        parts.append(tokens)
        starts.append(doc_starts + offset)
        offset += len(tokens)
    tokens = np.concatenate(parts) if parts else np.empty(0, dtype)
    doc_starts = np.concatenate(starts) if starts else np.empty(0, np.int64)
    with fsio.staged_dir(job.folder) as stage:
        np.save(stage / "tokens.npy", tokens)
        np.save(stage / "starts.npy", doc_starts)
        # no fsync: tokens.npy beside it is not synced either, so syncing meta.json alone bought no
        # durability (an entry is re-creatable from its inputs) and cost an fsync per group
        fsio.write_json(stage / "meta.json", {"files": job.files, "documents": len(doc_starts),
                                              "tokens": len(tokens), "chars": job.chars}, durable=False)
    return Stream(tokens, doc_starts, job.chars, False)
