"""Score a model on a packed split: loss, perplexity, bits per byte, per sequence and per document.

Bits per byte divides the summed negative log-likelihood (in bits) by the bytes of text the
predicted tokens stand for, so models with different tokenizers compare fairly. Per-sequence
figures pair a candidate and a baseline that read the same windows; per-document figures pair
them when their tokenizers (and so their windows) differ.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainer.arch import CausalLM
from trainer.data import PackedSplit

LN2 = math.log(2)


@dataclass
class Score:
    """One model on one packed split. ``seq_*`` are per window, ``doc_*`` per document."""

    packed: str                 # packed dataset folder the windows came from
    tokenizer_sha256: str
    loss: float                 # mean nats per predicted token
    bits_per_byte: float
    perplexity: float
    tokens: int
    bytes: int
    sequences: int
    seq_bits: np.ndarray        # float64, summed NLL in bits per window
    seq_bytes: np.ndarray       # int64, bytes of text predicted per window
    doc_bits: np.ndarray        # float64, indexed by document number in the split
    doc_bytes: np.ndarray
    complete_docs: int          # documents [0, complete_docs) were scored in full

    @property
    def seq_bpb(self) -> np.ndarray:
        return self.seq_bits / np.maximum(self.seq_bytes, 1)

    def summary(self) -> dict:
        return {"loss": self.loss, "bits_per_byte": self.bits_per_byte, "perplexity": self.perplexity,
                "tokens": self.tokens, "bytes": self.bytes, "sequences": self.sequences,
                "documents": self.complete_docs}


class DocumentIndex:
    """Which document each target token belongs to, numbered across the split's shards."""

    def __init__(self, data: PackedSplit, split: str) -> None:
        shards = data.manifest["splits"][split]["shards"]
        self.window = data.window
        self.starts = [np.load(data.root / s["docs"]) for s in shards]
        per_shard = [int(s["tokens"]) // self.window for s in shards]
        self.first_window = np.concatenate([[0], np.cumsum(per_shard)]).astype(np.int64)
        self.base = np.concatenate([[0], np.cumsum([len(s) for s in self.starts])]).astype(np.int64)

    def targets(self, indices: np.ndarray) -> np.ndarray:
        """(len(indices), seq_len) document numbers of each window's predicted tokens."""
        shard = np.searchsorted(self.first_window, indices, side="right") - 1
        out = np.empty((len(indices), self.window - 1), dtype=np.int64)
        offsets = np.arange(1, self.window)
        for row, (i, k) in enumerate(zip(indices, shard, strict=True)):
            lo = (int(i) - int(self.first_window[k])) * self.window
            out[row] = self.base[k] + np.searchsorted(self.starts[k], lo + offsets, side="right") - 1
        return out


def _batches(data: PackedSplit, docs: DocumentIndex, n: int, batch_size: int
             ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    for lo in range(0, n, batch_size):
        idx = np.arange(lo, min(n, lo + batch_size))
        x, y, d = data.batch(idx)
        yield x, y, d, docs.targets(idx)


def _prefetched(it: Iterator, depth: int = 2) -> Iterator:
    """Read the next batches on a thread while the model runs on this one (torch drops the GIL).
    The thread stops as soon as the consumer does, whether it finished or failed."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop, done = threading.Event(), object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fill() -> None:
        try:
            for item in it:
                if not put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)
            return
        put(done)

    threading.Thread(target=fill, daemon=True, name="eval-prefetch").start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


class Tally:
    """Running per-sequence and per-document sums of bits and bytes, as batches come in."""

    def __init__(self, data: PackedSplit, n: int) -> None:
        self.data, self.n = data, n
        self.seq_bits: list[np.ndarray] = []
        self.seq_bytes: list[np.ndarray] = []
        self.doc_bits, self.doc_bytes, self.last_doc = np.zeros(0), np.zeros(0, np.int64), 0

    def add(self, bits: np.ndarray, nbytes: np.ndarray, doc: np.ndarray) -> None:
        """``bits``, ``nbytes``, ``doc``: (batch, seq_len) per predicted token."""
        self.seq_bits.append(bits.sum(axis=1))
        self.seq_bytes.append(nbytes.sum(axis=1))
        size = int(doc.max()) + 1
        if size > len(self.doc_bits):
            self.doc_bits = np.pad(self.doc_bits, (0, size - len(self.doc_bits)))
            self.doc_bytes = np.pad(self.doc_bytes, (0, size - len(self.doc_bytes)))
        self.doc_bits[:size] += np.bincount(doc.ravel(), bits.ravel(), size)
        self.doc_bytes[:size] += np.bincount(doc.ravel(), nbytes.ravel(), size).astype(np.int64)
        self.last_doc = int(doc[-1, -1])

    def score(self) -> Score:
        bits, nbytes = np.concatenate(self.seq_bits), np.concatenate(self.seq_bytes)
        tokens = self.n * self.data.seq_len
        loss = float(bits.sum()) * LN2 / tokens
        # the document of the last scored token is complete only when the whole split was read
        complete = len(self.doc_bits) if self.n == len(self.data) else self.last_doc
        return Score(packed=str(self.data.root), tokenizer_sha256=self.data.manifest["tokenizer_sha256"],
                     loss=loss, bits_per_byte=float(bits.sum()) / max(int(nbytes.sum()), 1),
                     perplexity=math.exp(min(loss, 700)), tokens=tokens, bytes=int(nbytes.sum()),
                     sequences=self.n, seq_bits=bits, seq_bytes=nbytes, doc_bits=self.doc_bits,
                     doc_bytes=self.doc_bytes, complete_docs=complete)


def windows(data: PackedSplit, max_batches: int | None, batch_size: int) -> int:
    """How many windows an evaluation reads: the first ``max_batches * batch_size``, or all."""
    n = len(data) if max_batches is None else min(len(data), max_batches * batch_size)
    if n == 0:
        raise ValueError(f"{data.root}: packed split has no windows to evaluate")
    return n


def score(model: CausalLM, packed_root: str | Path, split: str = "val", batch_size: int = 16,
          max_batches: int | None = None, device: str = "cpu") -> Score:
    """Deterministic: the first ``max_batches * batch_size`` windows in order, no sampling."""
    root = Path(packed_root)
    data = PackedSplit(root, split)
    docs = DocumentIndex(data, split)
    token_bytes = np.load(root / "token_bytes.npy").astype(np.int64)
    tally = Tally(data, windows(data, max_batches, batch_size))
    model.eval().to(device)
    with torch.inference_mode():
        for x, y, d, doc in _prefetched(_batches(data, docs, tally.n, batch_size)):
            _, nll = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device),
                           torch.from_numpy(d).to(device), reduction="none")
            tally.add(nll.double().cpu().numpy() / LN2, token_bytes[y], doc)
    return tally.score()
