"""Tokenize spread over processes: the file groups cut into shards that separate tasks encode.

A shard is a run of whole groups (``groups.py``) of about ``pack.shard_bytes`` input bytes. Each
shard task encodes its groups into the token cache on one thread, so N tasks on N cores (mapped
Airflow tasks, ``taxiway tokenize --workers N``) scale; packing (``run``) then finds every group
in the cache and only packs, reading the same streams in the same order as when it encodes them
itself, so the packed dataset is the same byte for byte. A group already in the cache is skipped:
a retried or re-run shard costs nothing.

The plan is one JSON file per shard in the run folder (``tokenize/shards/``), each naming the
tokenizer and its groups' files, so a shard task reads only its own part of a large corpus.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipelines import manifest, storage
from pipelines.config import RunConfig
from pipelines.errors import BadInput
from pipelines.run_folder import Cache, cache_dir
from pipelines.tokenize import bpe, engine, inputs
from pipelines.tokenize.groups import FileRef, group_key, tokenize_groups
from trainer import fsio


def cut(groups: list[list[FileRef]], sizes: list[int], shard_bytes: int,
        fold_under: int = 0) -> list[list[list[FileRef]]]:
    """Consecutive runs of whole groups, each closed once it holds ``shard_bytes`` or more; a
    remainder under ``fold_under`` bytes joins the last run."""
    shards, current, held = [], [], 0
    for group, size in zip(groups, sizes, strict=True):
        current.append(group)
        held += size
        if held >= shard_bytes:
            shards.append(current)
            current, held = [], 0
    if current and shards and held < fold_under:
        shards[-1] += current
    elif current:
        shards.append(current)
    return shards


def plan(cfg: RunConfig, folder: Path, max_shards: int | None = None, min_shards: int = 1) -> list[dict[str, Any]]:
    """Train or load the tokenizer, cut both splits' groups into shards and write one file per shard
    into ``folder`` (replacing an earlier plan whole); returns each shard's index, groups and bytes.
    Shards of ``pack.shard_bytes``, smaller when that makes fewer than ``min_shards`` (N processes
    given 3 shards of a small corpus idle in turn: ``taxiway tokenize --workers`` asks for 4 a
    process), larger past ``max_shards`` (Airflow fails a task mapped wider than ``[core]
    max_map_length``)."""
    data = inputs(cfg)
    groups = [g for split in manifest.SPLITS for g in data.groups.get(split, [])]
    sizes = [sum(data.bytes[f.path] if f.path in data.bytes else storage.size(f.loc) for f in g) for g in groups]
    target = max(1, min(cfg.pack.shard_bytes, sum(sizes) // min_shards))
    # a remainder under half a shard rides with the last one: a task costs about half a second before
    # it encodes anything (the x10 corpus's seventh shard was one 8 KB group); counts asked for below
    # are cut exactly
    shards = cut(groups, sizes, target, fold_under=target // 2)
    while len(shards) < min(min_shards, len(groups)) and target > 1:  # whole groups of uneven sizes
        target = target * 7 // 8
        shards = cut(groups, sizes, target)
    while max_shards and len(shards) > max_shards:
        target = max(-(-sum(sizes) // max_shards), target + target // 8)
        shards = cut(groups, sizes, target)
    header = {"tokenizer": str(data.tok_path), "tokenizer_sha256": data.tok_sha,
              "eos_token": cfg.tokenizer.eos_token, "dtype": data.dtype.name, "format": cfg.data.format}
    summary, first = [], 0
    shutil.rmtree(folder, ignore_errors=True)
    with fsio.staged_dir(folder) as stage:
        for index, shard in enumerate(shards):
            fsio.write_json(stage / f"{index:05d}.json", {**header, "groups": [
                [{"path": f.path, "sha256": f.sha256, "uri": f.loc.uri()} for f in group] for group in shard]},
                durable=False)
            held = sum(sizes[first:first + len(shard)])
            summary.append({"shard": index, "groups": len(shard), "bytes": held})
            first += len(shard)
    return summary


@functools.lru_cache(maxsize=1)
def _encoder(path: str, sha256: str, eos_token: str) -> tuple[int, engine.Encoder]:
    """The EOS id and a one-thread batch encoder, built once per process (a ``--workers`` process
    encodes many shards; building one costs about 0.1 s); keyed by the tokenizer's sha256 too."""
    tok = bpe.load(path, eos_token)
    return tok.token_to_id(eos_token), engine.batch_encoder(tok, path, threads=1)


# a forked worker must build its own: an inherited encoder's thread pool has no threads in the child
os.register_at_fork(after_in_child=_encoder.cache_clear)


def encode(folder: Path, index: int) -> dict[str, Any]:
    """Encode shard ``index`` of the plan in ``folder`` into the token cache on one thread (N shard
    tasks on N cores scale; all threads in each would fight over the cores); what it found cached
    and what it encoded."""
    started = time.perf_counter()
    path = folder / f"{index:05d}.json"
    if not path.is_file():
        raise BadInput(f"{path}: no such tokenize shard; the plan (tokenize.tokenizer) has not written it")
    shard = json.loads(path.read_text())
    dtype, tok_sha, fmt = np.dtype(shard["dtype"]), shard["tokenizer_sha256"], shard["format"]
    groups = [[FileRef(f["path"], f["sha256"], storage.locate(f["uri"])) for f in g] for g in shard["groups"]]
    cache = Cache(cache_dir())
    keys = [group_key(g, tok_sha, fmt, dtype) for g in groups]

    def missing() -> list[list[FileRef]]:
        return [g for g, key in zip(groups, keys, strict=True) if not (cache.tokens(key) / "meta.json").is_file()]

    encoded = documents = tokens = 0
    if missing():
        # concurrent runs of one corpus plan the same shards: one encodes, the others wait, then find it cached
        with cache.building(cache.tokens("shard-" + hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:32])):
            if todo := missing():
                eos, encoder = _encoder(shard["tokenizer"], tok_sha, shard["eos_token"])
                for stream in tokenize_groups(todo, encoder, tok_sha, eos, dtype, fmt, cache):
                    if not stream.cache_hit:  # else another process cached the group meanwhile
                        encoded, documents, tokens = (encoded + 1, documents + len(stream.starts),
                                                      tokens + len(stream.tokens))
    return {"shard": index, "groups": len(groups), "cached": len(groups) - encoded, "encoded": encoded,
            "documents": documents, "tokens": tokens, "seconds": round(time.perf_counter() - started, 3)}
