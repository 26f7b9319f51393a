"""Packing: documents joined with EOS, cut into fixed ``seq_len + 1`` windows.

A split is written as flat numpy shards (``tokens-NNNNN.npy``, one window after another) and a
boundary index per shard (``docs-NNNNN.npy``: flat offsets where a document starts) so the
trainer can keep attention inside documents and restart positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelines.manifest import sha256_file


def dtype_for(vocab_size: int) -> np.dtype:
    if vocab_size <= np.iinfo(np.uint16).max + 1:
        return np.dtype(np.uint16)
    if vocab_size <= np.iinfo(np.uint32).max + 1:
        return np.dtype(np.uint32)
    raise ValueError(f"vocabulary of {vocab_size} tokens does not fit uint32")


@dataclass
class SplitWriter:
    """Streams encoded documents into window-aligned shards; the tail that fills no window drops."""

    folder: Path
    seq_len: int
    eos_id: int
    dtype: np.dtype
    shard_tokens: int
    documents: int = 0
    tokens: int = 0
    shards: list[dict] = field(default_factory=list)
    _buf: list[np.ndarray] = field(default_factory=list)
    _starts: list[int] = field(default_factory=list)
    _buffered: int = 0

    @property
    def window(self) -> int:
        return self.seq_len + 1

    def add(self, ids: list[int]) -> None:
        self._starts.append(self._buffered)
        doc = np.asarray(ids + [self.eos_id], dtype=self.dtype)
        self._buf.append(doc)
        self._buffered += len(doc)
        self.documents += 1
        self.tokens += len(doc)
        per_shard = max(1, self.shard_tokens // self.window) * self.window
        while self._buffered >= per_shard:
            self._flush(per_shard)

    def close(self) -> dict:
        usable = (self._buffered // self.window) * self.window
        dropped = self._buffered - usable
        if usable:
            self._flush(usable)
        windows = sum(s["windows"] for s in self.shards)
        return {"documents": self.documents, "tokens": self.tokens, "windows": windows,
                "dropped_tokens": dropped, "waste_fraction": dropped / max(1, self.tokens),
                "shards": self.shards}

    def _flush(self, n: int) -> None:
        flat = np.concatenate(self._buf)
        head, rest = flat[:n], flat[n:]
        starts = np.asarray([s for s in self._starts if s < n], dtype=np.int64)
        rest_starts = [s - n for s in self._starts if s >= n]
        idx = len(self.shards)
        self.folder.mkdir(parents=True, exist_ok=True)
        tok_path, doc_path = self.folder / f"tokens-{idx:05d}.npy", self.folder / f"docs-{idx:05d}.npy"
        np.save(tok_path, head)
        np.save(doc_path, starts)
        self.shards.append({"path": f"{self.folder.name}/{tok_path.name}", "docs": f"{self.folder.name}/{doc_path.name}",
                            "sha256": sha256_file(tok_path), "tokens": int(n), "windows": int(n // self.window)})
        self._buf = [rest] if len(rest) else []
        self._starts = rest_starts
        self._buffered = len(rest)
