"""Packing: token streams (documents joined with EOS) cut into fixed ``seq_len + 1`` windows.

A split is written as flat numpy shards (``tokens-NNNNN.npy``, one window after another) and a
boundary index per shard (``docs-NNNNN.npy``: flat offsets where a document starts) so the
trainer can keep attention inside documents and restart positions. The tail that fills no
whole window is dropped and counted as waste.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pipelines.errors import BadInput
from trainer.fsio import sha256_file


def dtype_for(vocab_size: int, declared: str = "auto") -> np.dtype:
    """``uint16`` when the vocabulary fits, else ``uint32``; a declared dtype that is too small is an error."""
    fits16 = vocab_size <= np.iinfo(np.uint16).max + 1
    if declared == "uint16" and not fits16:
        raise BadInput(f"pack.dtype: vocabulary of {vocab_size} tokens does not fit uint16 (max 65536)")
    if vocab_size > np.iinfo(np.uint32).max + 1:
        raise BadInput(f"vocabulary of {vocab_size} tokens does not fit uint32")
    if declared == "auto":
        return np.dtype(np.uint16 if fits16 else np.uint32)
    return np.dtype(declared)


_HEADER_BYTES = 128  # fixed .npy header size, so a shard's header can be rewritten in place


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    """A version 1.0 .npy header for a flat array of ``n`` items, padded to ``_HEADER_BYTES``."""
    body = repr({"descr": dtype.str, "fortran_order": False, "shape": (n,)}).encode()
    body = body.ljust(_HEADER_BYTES - 10 - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


@dataclass
class SplitWriter:
    """Streams token streams straight into window-aligned shard files.

    Memory stays flat whatever the corpus or shard size: tokens are appended to the open shard
    file as they come; a full shard is closed, and at the end the last shard is cut to whole
    windows and its header rewritten with the final length.
    """

    folder: Path
    seq_len: int
    dtype: np.dtype
    shard_tokens: int
    documents: int = 0
    tokens: int = 0
    shards: list[dict] = field(default_factory=list)
    _fh: BinaryIO | None = None
    _in_shard: int = 0
    _starts: list[np.ndarray] = field(default_factory=list)

    @property
    def window(self) -> int:
        return self.seq_len + 1

    @property
    def per_shard(self) -> int:
        return max(1, self.shard_tokens // self.window) * self.window

    def _path(self, kind: str) -> Path:
        return self.folder / f"{kind}-{len(self.shards):05d}.npy"

    def add_stream(self, tokens: np.ndarray, doc_starts: np.ndarray) -> None:
        """Append a stream of whole documents (each ending in EOS); ``doc_starts`` are offsets in it."""
        tokens = np.asarray(tokens, dtype=self.dtype)
        doc_starts = np.asarray(doc_starts, dtype=np.int64)
        self.documents += len(doc_starts)
        self.tokens += len(tokens)
        pos = 0
        while pos < len(tokens):
            if self._fh is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._fh = open(self._path("tokens"), "wb")
                self._fh.write(_npy_header(self.dtype, self.per_shard))
                self._in_shard, self._starts = 0, []
            take = min(self.per_shard - self._in_shard, len(tokens) - pos)
            self._fh.write(tokens[pos:pos + take].tobytes())
            inside = doc_starts[(doc_starts >= pos) & (doc_starts < pos + take)]
            self._starts.append(inside - pos + self._in_shard)
            self._in_shard += take
            pos += take
            if self._in_shard == self.per_shard:
                self._close_shard(self.per_shard)

    def close(self) -> dict:
        dropped = 0
        if self._fh is not None:
            usable = (self._in_shard // self.window) * self.window
            dropped = self._in_shard - usable
            self._close_shard(usable)
        windows = sum(s["windows"] for s in self.shards)
        return {"documents": self.documents, "tokens": self.tokens, "windows": windows,
                "dropped_tokens": dropped, "waste_fraction": dropped / max(1, self.tokens),
                "shards": self.shards}

    def _close_shard(self, n: int) -> None:
        fh, self._fh = self._fh, None
        tok_path = Path(fh.name)
        if n == 0:
            fh.close()
            tok_path.unlink()
            return
        fh.truncate(_HEADER_BYTES + n * self.dtype.itemsize)
        fh.seek(0)
        fh.write(_npy_header(self.dtype, n))
        fh.close()
        starts = np.concatenate(self._starts) if self._starts else np.empty(0, np.int64)
        doc_path = self._path("docs")
        np.save(doc_path, starts[starts < n])
        self.shards.append({"path": f"{self.folder.name}/{tok_path.name}", "docs": f"{self.folder.name}/{doc_path.name}",
                            "sha256": sha256_file(tok_path), "tokens": int(n), "windows": int(n // self.window)})
