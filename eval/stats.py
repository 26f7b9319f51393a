"""Paired bootstrap of the bits-per-byte improvement of a candidate over a baseline.

The statistic is the pooled improvement, baseline bits/bytes minus candidate bits/bytes over
the same units, i.e. exactly the headline figure; each resample draws units with replacement
and keeps every unit's candidate and baseline together (paired), so the shared difficulty of a
passage cancels and only the models' difference varies. Seeded: the same inputs give the same
bounds on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eval.score import Score


@dataclass(frozen=True)
class Paired:
    """Per-unit bits and bytes of both models over the same text."""

    unit: str                  # "sequence" (same windows) or "document" (different tokenizers)
    cand_bits: np.ndarray
    cand_bytes: np.ndarray
    base_bits: np.ndarray
    base_bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.cand_bits)

    @property
    def cand_bpb(self) -> np.ndarray:
        return self.cand_bits / np.maximum(self.cand_bytes, 1)

    @property
    def base_bpb(self) -> np.ndarray:
        return self.base_bits / np.maximum(self.base_bytes, 1)


@dataclass(frozen=True)
class Interval:
    point: float               # improvement on all units (baseline bpb - candidate bpb)
    lower: float               # one-sided lower bound at ``confidence``
    upper: float               # one-sided upper bound at ``confidence``
    confidence: float
    samples: int
    seed: int


def pair(candidate: Score, baseline: Score) -> Paired:
    """Sequence by sequence when both read the same windows; else document by document over the
    documents both scored in full (another tokenizer cuts the same text into other windows)."""
    if candidate.packed == baseline.packed and candidate.sequences == baseline.sequences:
        return Paired("sequence", candidate.seq_bits, candidate.seq_bytes, baseline.seq_bits, baseline.seq_bytes)
    n = min(candidate.complete_docs, baseline.complete_docs)
    keep = (candidate.doc_bytes[:n] > 0) & (baseline.doc_bytes[:n] > 0)
    if not keep.any():
        raise ValueError("candidate and baseline share no fully scored validation document to compare on; "
                         "raise eval.max_batches (or unset it) so whole documents are scored")
    return Paired("document", candidate.doc_bits[:n][keep], candidate.doc_bytes[:n][keep],
                  baseline.doc_bits[:n][keep], baseline.doc_bytes[:n][keep])


def paired_bootstrap(p: Paired, confidence: float, samples: int, seed: int) -> Interval:
    """Bounds of the pooled improvement from ``samples`` paired resamples of the units."""
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence {confidence} must be in [0.5, 1)")
    n = len(p)
    if n == 0:
        raise ValueError("no units to bootstrap over")
    point = p.base_bits.sum() / max(p.base_bytes.sum(), 1) - p.cand_bits.sum() / max(p.cand_bytes.sum(), 1)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(samples, 4_000_000 // n))  # bounds the index matrix to ~32 MB
    stats = []
    for start in range(0, samples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, samples - start), n))
        base = p.base_bits[idx].sum(axis=1) / np.maximum(p.base_bytes[idx].sum(axis=1), 1)
        cand = p.cand_bits[idx].sum(axis=1) / np.maximum(p.cand_bytes[idx].sum(axis=1), 1)
        stats.append(base - cand)
    diffs = np.concatenate(stats)
    lower, upper = np.quantile(diffs, [1 - confidence, confidence])
    return Interval(float(point), float(lower), float(upper), confidence, samples, seed)
