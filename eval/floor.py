"""The floor a first model must beat when nothing is registered yet.

``unigram``: every token costs -log2 of its frequency among the scored validation tokens — the
entropy of the validation set under the best context-free model (fitted on the very tokens it
is scored on, so it is a demanding floor: a model must have learned something about context).
``uniform``: every token costs log2(vocabulary size) — what a model that learned nothing pays.
Both are scored on the candidate's own windows, so the gate pairs them sequence by sequence.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from eval.score import DocumentIndex, Score, Tally
from trainer.data import PackedSplit

FLOORS = ("unigram", "uniform")


def _targets(data: PackedSplit, n: int, batch_size: int = 256) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for lo in range(0, n, batch_size):
        idx = np.arange(lo, min(n, lo + batch_size))
        yield idx, data.batch(idx)[1]


def floor(kind: str, packed_root: str | Path, n_windows: int, split: str = "val") -> Score:
    """The ``kind`` floor over the first ``n_windows`` windows (those the candidate was scored on)."""
    if kind not in FLOORS:
        raise ValueError(f"eval.floor: {kind!r} is not one of {', '.join(FLOORS)}")
    root = Path(packed_root)
    data = PackedSplit(root, split)
    docs = DocumentIndex(data, split)
    token_bytes = np.load(root / "token_bytes.npy").astype(np.int64)
    tally = Tally(data, min(n_windows, len(data)))
    vocab = len(token_bytes)
    if kind == "unigram":
        counts = np.zeros(vocab, dtype=np.int64)
        for _, y in _targets(data, tally.n):
            counts += np.bincount(y.ravel(), minlength=vocab)
        with np.errstate(divide="ignore"):
            cost = -np.log2(counts / counts.sum())  # unseen tokens are never looked up
    else:
        cost = np.full(vocab, math.log2(vocab))
    for idx, y in _targets(data, tally.n):
        tally.add(cost[y], token_bytes[y], docs.targets(idx))
    return tally.score()
