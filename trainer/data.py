"""Reader for packed datasets: memory-mapped windows, document ids, resumable sharded sampling.

Format (written by ``pipelines.tokenize``): ``<root>/manifest.json`` and per split flat shards
``tokens-NNNNN.npy`` (windows of ``seq_len + 1`` tokens back to back) with ``docs-NNNNN.npy``
(flat offsets where a document starts).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


class PackedSplit:
    def __init__(self, root: str | Path, split: str) -> None:
        self.root = Path(root)
        self.manifest = json.loads((self.root / "manifest.json").read_text())
        self.seq_len = int(self.manifest["seq_len"])
        self.window = self.seq_len + 1
        shards = self.manifest["splits"][split]["shards"]
        self._tokens = [np.load(self.root / s["path"], mmap_mode="r") for s in shards]
        self._starts = [np.load(self.root / s["docs"]) for s in shards]
        counts = [len(t) // self.window for t in self._tokens]
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def item(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``i`` as (tokens[seq_len + 1], doc_ids[seq_len]) for the input positions."""
        shard = int(np.searchsorted(self._offsets, i, side="right") - 1)
        lo = (i - int(self._offsets[shard])) * self.window
        tokens = np.asarray(self._tokens[shard][lo:lo + self.window], dtype=np.int64)
        starts = self._starts[shard]  # sorted: a binary search, not a scan of every document
        first, stop = np.searchsorted(starts, [lo + 1, lo + self.seq_len])
        local = starts[first:stop] - lo
        marks = np.zeros(self.seq_len, dtype=np.int64)
        marks[local] = 1
        return tokens, np.cumsum(marks)

    def batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, y, doc_ids), each (len(indices), seq_len)."""
        toks, docs = zip(*(self.item(int(i)) for i in indices), strict=True)
        tokens = np.stack(toks)
        return tokens[:, :-1], tokens[:, 1:], np.stack(docs)


@dataclass
class SamplerState:
    epoch: int = 0
    position: int = 0


class ShardedSampler:
    """Deterministic shuffled batches per rank; the state is (epoch, position) and resumes exactly.

    Each global step consumes ``batch_size * world_size`` windows of one epoch's permutation;
    rank r takes its contiguous slice. A partial global batch at an epoch's end is skipped.
    """

    def __init__(self, n: int, batch_size: int, rank: int, world_size: int, seed: int) -> None:
        if n < batch_size * world_size:
            raise ValueError(f"dataset has {n} windows, fewer than one global batch "
                             f"({batch_size} x {world_size} ranks)")
        self.n, self.batch_size, self.rank, self.world, self.seed = n, batch_size, rank, world_size, seed
        self.state = SamplerState()
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def _permutation(self) -> np.ndarray:
        if self._perm_epoch != self.state.epoch:
            self._perm = np.random.default_rng([self.seed, self.state.epoch]).permutation(self.n)
            self._perm_epoch = self.state.epoch
        return self._perm

    def next_indices(self) -> np.ndarray:
        stride = self.batch_size * self.world
        if self.state.position + stride > self.n:
            self.state = SamplerState(self.state.epoch + 1, 0)
        start = self.state.position + self.rank * self.batch_size
        out = self._permutation()[start:start + self.batch_size]
        self.state.position += stride
        return out

    def state_dict(self) -> dict:
        return asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = SamplerState(**state)
