"""Packing: token streams (documents joined with EOS) cut into fixed ``seq_len + 1`` windows.

A split is written as flat numpy shards (``tokens-NNNNN.npy``, one window after another) and a
boundary index per shard (``docs-NNNNN.npy``: flat offsets where a document starts) so the
trainer can keep attention inside documents and restart positions. The tail that fills no
whole window is dropped and counted as waste.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelines.manifest import sha256_file


def dtype_for(vocab_size: int, declared: str = "auto") -> np.dtype:
    """``uint16`` when the vocabulary fits, else ``uint32``; a declared dtype that is too small is an error."""
    fits16 = vocab_size <= np.iinfo(np.uint16).max + 1
    if declared == "uint16" and not fits16:
        raise ValueError(f"pack.dtype: vocabulary of {vocab_size} tokens does not fit uint16 (max 65536)")
    if vocab_size > np.iinfo(np.uint32).max + 1:
        raise ValueError(f"vocabulary of {vocab_size} tokens does not fit uint32")
    if declared == "auto":
        return np.dtype(np.uint16 if fits16 else np.uint32)
    return np.dtype(declared)


@dataclass
class SplitWriter:
    """Streams token streams into window-aligned shards."""

    folder: Path
    seq_len: int
    dtype: np.dtype
    shard_tokens: int
    documents: int = 0
    tokens: int = 0
    shards: list[dict] = field(default_factory=list)
    _buf: list[np.ndarray] = field(default_factory=list)
    _starts: list[np.ndarray] = field(default_factory=list)
    _buffered: int = 0

    @property
    def window(self) -> int:
        return self.seq_len + 1

    def add_stream(self, tokens: np.ndarray, doc_starts: np.ndarray) -> None:
        """Append a stream of whole documents (each ending in EOS); ``doc_starts`` are offsets in it."""
        self._buf.append(tokens.astype(self.dtype, copy=False))
        self._starts.append(doc_starts.astype(np.int64) + self._buffered)
        self._buffered += len(tokens)
        self.documents += len(doc_starts)
        self.tokens += len(tokens)
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
        flat = np.concatenate(self._buf) if len(self._buf) > 1 else self._buf[0]
        starts = np.concatenate(self._starts) if self._starts else np.empty(0, np.int64)
        head, rest = flat[:n], flat[n:]
        idx = len(self.shards)
        self.folder.mkdir(parents=True, exist_ok=True)
        tok_path, doc_path = self.folder / f"tokens-{idx:05d}.npy", self.folder / f"docs-{idx:05d}.npy"
        np.save(tok_path, head)
        np.save(doc_path, starts[starts < n])
        self.shards.append({"path": f"{self.folder.name}/{tok_path.name}", "docs": f"{self.folder.name}/{doc_path.name}",
                            "sha256": sha256_file(tok_path), "tokens": int(n), "windows": int(n // self.window)})
        self._buf = [rest] if len(rest) else []
        self._starts = [starts[starts >= n] - n]
        self._buffered = len(rest)
