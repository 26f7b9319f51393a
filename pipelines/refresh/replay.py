"""Replay: a seeded share of the documents the champion was trained on, mixed into a refresh's
train split so it does not forget what it knew.

Drawn at the token level from the old data's cached token groups (``pipelines/tokenize/groups.py``),
rebuilt exactly as they were packed, so their keys match and their streams come from the cache:
the base corpus from its manifest, and the batches of each earlier refresh from the files its
ledger row lists as packed (held-out files and documents dropped as repeats were never trained,
and are not replayed). A group the cache lost is encoded again from its files and counted; one that
holds a file trained without some of its documents is then left out (its trained text is gone).
Each document is kept when a generator seeded by ``train.seed`` and the group's key draws below the
share that makes old tokens ``refresh.replay_fraction`` of the train mixture: the same documents
on every retry and every machine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from pipelines import manifest, storage
from pipelines.config import DataConfig
from pipelines.refresh.layout import NEW
from pipelines.tokenize.groups import FileRef, Stream, group_key, split_groups, tokenize_group


@dataclass(frozen=True)
class Replay:
    groups: list[list[FileRef]]
    partial: frozenset[str]  # paths of files trained without some of their documents
    fraction: float
    seed: int

    def material(self) -> dict:
        """What shapes the replayed tokens besides the new data (part of the packed dataset's key)."""
        return {"fraction": self.fraction, "seed": self.seed,
                "groups": [[(f.path, f.sha256) for f in g] for g in self.groups]}

    def streams(self, new_tokens: int, encode, tokenizer_sha256: str, eos: int, dtype: np.dtype,
                data_format: str | None, cache) -> tuple[list[Stream], dict]:
        """The documents replayed from each old group, each old document kept with the probability that
        makes old tokens ``fraction`` of the mixture with ``new_tokens``; and what the cache answered."""
        keys = [group_key(g, tokenizer_sha256, data_format, dtype) for g in self.groups]
        usable, lost, skipped, old_tokens = [], 0, 0, 0
        for group, key in zip(self.groups, keys, strict=True):
            meta = cache.tokens(key) / "meta.json"
            if not meta.is_file():
                lost += 1
                if any(f.path in self.partial for f in group):
                    skipped += 1
                    continue
                tokenize_group(group, encode, tokenizer_sha256, eos, dtype, data_format, cache)
            old_tokens += json.loads(meta.read_text())["tokens"]
            usable.append((group, key))
        keep = min(1.0, new_tokens * self.fraction / (1 - self.fraction) / old_tokens) if old_tokens else 0.0
        out = [sample(tokenize_group(g, encode, tokenizer_sha256, eos, dtype, data_format, cache), k, keep, self.seed)
               for g, k in usable]
        return out, {"groups": len(self.groups), "groups_reused": len(self.groups) - lost,
                     "groups_left_out": skipped, "keep_probability": round(keep, 6)}


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


def old_groups(base: DataConfig, landing: str, ledger: tuple[dict, ...]) -> tuple[list[list[FileRef]], frozenset[str]]:
    """The champion's train data as token groups, as each was packed: the base corpus by its
    manifest, then per model version that trained batches, the files its ledger rows list; and the
    paths of files packed without some of their documents (``landing``: the landing zone)."""
    root = manifest.root_of(base.manifest)
    groups = split_groups([FileRef(e.path, e.sha256, root.join(e.path))
                           for e in manifest.read(base.manifest) if e.split == "train"])
    zone = storage.locate(landing)
    partial, by_version = set(), {}
    for row in ledger:
        for path, sha, cut in row.get("train", []):
            ref = FileRef(f"{NEW}/{row['id']}/{path}", sha, zone.join(f"{row['id']}/{path}"))
            by_version.setdefault(row["version"], []).append(ref)
            if cut:
                partial.add(ref.path)
    for refs in by_version.values():  # one refresh packed all its batches' files together
        groups += split_groups(refs)
    return groups, frozenset(partial)
