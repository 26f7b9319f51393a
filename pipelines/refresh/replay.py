"""Replay: a seeded share of the documents the champion was trained on, mixed into a refresh's
train split so it does not forget what it knew.

Drawn at the token level from the old data's cached token groups (``pipelines/tokenize/groups.py``):
the groups of the base corpus are rebuilt from its manifest exactly as its first packing cut them,
so their keys match and their token streams are read from the cache; nothing is tokenized again
unless the cache lost a group (then that group is encoded once more and counted). Each document is
kept when a generator seeded by ``train.seed`` and the group's key draws below the share that makes
old tokens ``refresh.replay_fraction`` of the train mixture: the same documents on every retry
and every machine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipelines import manifest, storage
from pipelines.config import DataConfig, RunConfig
from pipelines.refresh.landing import MANIFEST
from pipelines.refresh.layout import NEW
from pipelines.tokenize.groups import FileRef, Stream, group_key, split_groups, tokenize_group


@dataclass(frozen=True)
class Replay:
    groups: list[list[FileRef]]
    fraction: float
    seed: int

    def material(self) -> dict:
        """What shapes the replayed tokens besides the new data (part of the packed dataset's key)."""
        return {"fraction": self.fraction, "seed": self.seed,
                "groups": [[(f.path, f.sha256) for f in g] for g in self.groups]}

    def streams(self, new_tokens: int, encode, tokenizer_sha256: str, eos: int, dtype: np.dtype,
                data_format: str | None, cache) -> Iterator[tuple[Stream, Stream]]:
        """(whole old group, the documents replayed from it) per old group: each old document is
        kept with the probability that makes old tokens ``fraction`` of the mixture with
        ``new_tokens`` (all of them when there are too few)."""
        keys = [group_key(g, tokenizer_sha256, data_format, dtype) for g in self.groups]
        old_tokens = 0
        for group, key in zip(self.groups, keys, strict=True):
            meta = cache.tokens(key) / "meta.json"
            if not meta.is_file():  # lost from the cache: encoded once more (and cached again)
                tokenize_group(group, encode, tokenizer_sha256, eos, dtype, data_format, cache)
            old_tokens += json.loads(meta.read_text())["tokens"]
        want = new_tokens * self.fraction / (1 - self.fraction)
        keep = min(1.0, want / old_tokens) if old_tokens else 0.0
        for group, key in zip(self.groups, keys, strict=True):
            stream = tokenize_group(group, encode, tokenizer_sha256, eos, dtype, data_format, cache)
            yield stream, sample(stream, key, keep, self.seed)


def sample(stream: Stream, key: str, fraction: float, seed: int) -> Stream:
    """The documents of ``stream`` that a generator seeded by (``seed``, ``key``) keeps."""
    n = len(stream.starts)
    ends = np.append(stream.starts[1:], len(stream.tokens)).astype(np.int64)
    lengths = ends - stream.starts
    rng = np.random.default_rng([seed, int(hashlib.sha256(key.encode()).hexdigest()[:15], 16)])
    keep = rng.random(n) < fraction
    mask = np.repeat(keep, lengths)
    kept_lengths = lengths[keep]
    starts = np.concatenate([[0], np.cumsum(kept_lengths)[:-1]]).astype(np.int64) if len(kept_lengths) else np.empty(0, np.int64)
    return Stream(stream.tokens[mask], starts, 0, stream.cache_hit)


def old_groups(cfg: RunConfig, plan: dict) -> list[list[FileRef]]:
    """The champion's train data as token groups: the base corpus as its manifest lists it, then each
    batch of its ledger as the refresh that trained on it laid it out."""
    base = DataConfig(**plan["base_data"])
    root = manifest.root_of(base.manifest)
    refs = [FileRef(e.path, e.sha256, root.join(e.path)) for e in manifest.read(base.manifest) if e.split == "train"]
    groups = split_groups(refs)
    zone = storage.locate(plan["landing"])
    for b in plan["ledger"]:
        batch_root = zone.join(b["id"])
        entries = manifest.read(batch_root.join(MANIFEST).uri())
        groups += split_groups([FileRef(f"{NEW}/{b['id']}/{e.path}", e.sha256, batch_root.join(e.path))
                                for e in entries if e.split == "train"])
    return groups


def of_run(cfg: RunConfig, plan: dict) -> Replay | None:
    if cfg.refresh.replay_fraction == 0:
        return None
    return Replay(old_groups(cfg, plan), cfg.refresh.replay_fraction, cfg.train.seed)
